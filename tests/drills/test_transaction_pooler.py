"""Drill 21: PgBouncer in transaction mode in front of the server, api and workers through it.

Debian's PgBouncer (1.18: no ``max_prepared_statements``) is started by the drill on a loopback
port, ``pool_mode = transaction``, in front of the test server. The daemons use it the way
contract section 12 says: ``DATABASE_URL`` at PgBouncer, ``DATABASE_STATEMENT_CACHE_SIZE=0``,
``LISTEN_MODE=poll``, and the workers' ``DATABASE_DIRECT_URL`` at the server for the install's
session lock. The api has no direct URL at all.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from api_sender import Sender, new_ulid
from tests.drills.helpers import (
    DRILL_ENV,
    SCALE,
    Fleet,
    create_ledger,
    fetch,
    runs,
    sized,
    wait_for,
)
from tests.drills.test_install_race import check_installed_once
from tests.support.hub import Hub
from tests.support.processes import Daemon, run_cli
from tests.support.servers import PgBouncer, running_pgbouncer
from tests.support.tools import require_tool

pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills")]

QUEUE = "drill-work"
TOKEN = "drill-ingest-token"
#: What a session-dependent statement through a transaction pooler fails with (issue 13).
SESSION_ERRORS = (
    "prepared statement",
    "PreparedStatement",
    "InvalidSQLStatementName",
    "incorrect binary data format",
    "unsupported startup parameter",
    "InvalidCachedStatement",
    "advisory",
)
#: Through the pooler: no statement cache, no LISTEN.
POOLED = {"LISTEN_MODE": "poll", "DATABASE_STATEMENT_CACHE_SIZE": "0"}


@pytest.fixture
def bouncer() -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode in front of the test server, stopped after the drill."""
    with running_pgbouncer(require_tool("pgbouncer", "pgbouncer"), "chassis-pgbouncer-") as server:
        yield server


def through(bouncer: PgBouncer, url: str) -> str:
    """``url``'s database, reached through PgBouncer."""
    return bouncer.url(urlsplit(url).path.lstrip("/"))


def clean_logs(daemons: list[Daemon]) -> None:
    """Every line each daemon wrote is a JSON event, and none names a session error."""
    for daemon in daemons:
        for line in daemon.logs().splitlines():
            try:
                value = json.loads(line)
            except ValueError:
                raise AssertionError(f"pid {daemon.pid} wrote a non-JSON line: {line}") from None
            assert isinstance(value, dict), line
            for words in SESSION_ERRORS:
                assert words not in line, f"pid {daemon.pid}: {line}"


def post_events(url: str, n: int) -> set[str]:
    """Ingest ``n`` events through the api's HTTP ingest, 100 a request; their ids."""
    ids: set[str] = set()
    for start in range(0, n, 100):
        events = [
            {
                "id": new_ulid(),
                "meter": "api.calls",
                "quantity": 1,
                "workspace_id": "w1",
                "occurred_at": "2026-01-01T00:00:00Z",
            }
            for _ in range(min(100, n - start))
        ]
        response = httpx.post(
            url,
            json={"events": events},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=30,
        )
        assert response.status_code == 202, response.text
        ids |= {str(e["id"]) for e in events}
    return ids


async def send_from_tasks(url: str, total: int, tasks: int) -> tuple[set[int], float]:
    """``total`` single sends through ``url`` from ``tasks`` concurrent tasks on one
    ``Sender.connect(url, pooled=True)`` (no named prepared statement); the ids, and the seconds
    it took."""
    sender = await Sender.connect(url, min_size=1, max_size=20, pooled=True).open()
    ids: set[int] = set()

    async def one_task(k: int) -> None:
        for i in range(k, total, tasks):
            job_id = await sender.send(QUEUE, {"n": i})
            assert job_id is not None
            ids.add(job_id)

    began = time.monotonic()
    try:
        await asyncio.gather(*(one_task(k) for k in range(tasks)))
    finally:
        await sender.close()
    return ids, time.monotonic() - began


async def test_api_and_workers_through_pgbouncer_lose_nothing(
    db_url: str, fleet: Fleet, bouncer: PgBouncer, hub: Hub, drill_report
):
    """Two workers and an api through PgBouncer in transaction mode: jobs sent by api_sender
    from 50 concurrent tasks through PgBouncer all run exactly once, usage events ingested by
    the api while the hub is down are all delivered once it is back, nobody exits, and no log
    line names a prepared-statement or session error (every line is a JSON event)."""
    jobs = sized(500, 10_000)
    events = sized(200, 2_000)
    outage = sized(3.0, 20.0)
    pooled = through(bouncer, db_url)
    await create_ledger(db_url)
    usage = {
        **hub.env(),
        "USAGE_BATCH_SIZE": "50",
        "USAGE_RETRY_LIMIT": "3",
        "USAGE_RETRY_DELAY_SECONDS": "0",
        "USAGE_HELD_DELAY_SECONDS": "1",
    }
    workers = await fleet.start_ready(
        pooled, {**POOLED, **usage, "DATABASE_DIRECT_URL": db_url}, count=2
    )
    [api] = await fleet.start_ready(pooled, {**POOLED, "INGEST_TOKEN": TOKEN}, role="api")
    hub.set(mode="fail")
    ingest = asyncio.create_task(
        asyncio.to_thread(post_events, api.url("/v1/usage-events"), events)
    )
    ids, send_seconds = await send_from_tasks(pooled, jobs, 50)
    event_ids = await ingest
    await asyncio.sleep(max(0.0, outage - send_seconds))
    # In poll mode a worker finds the events at its next probe: on a loaded machine the sends
    # may outlast the outage before any delivery was tried, so hold the hub down until the first
    # attempt has met it (bounded), rather than judging the drill by the clock.
    deadline = time.monotonic() + sized(30.0, 60.0)
    while not hub.snapshot().statuses.get(hub.fail_status, 0) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    failed_posts = hub.snapshot().statuses.get(hub.fail_status, 0)
    hub.set(mode="ok")

    async def all_done() -> bool:
        return not (await runs(db_url, QUEUE)).missing(ids)

    drained = await wait_for(all_done, sized(120, 900), f"{jobs} jobs to run", step=0.5)
    await asyncio.to_thread(hub.wait_accepted, event_ids, sized(60, 300))
    ledger = await runs(db_url, QUEUE)
    assert len(ids) == jobs
    assert not ledger.missing(ids)
    assert ledger.duplicates == {}, f"ran twice: {list(ledger.duplicates)[:10]}"
    rows = await fetch(
        db_url,
        "SELECT count(*) AS n FROM jobs.job WHERE queue = $1 AND state = 'completed'",
        QUEUE,
    )
    assert rows[0]["n"] == jobs
    assert failed_posts > 0, "the hub outage was never seen"
    assert hub.accepted_ids() == event_ids
    assert fleet.running() == fleet.all, "a daemon exited"
    listeners = await fetch(
        db_url,
        "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'chassis-worker listener'",
    )
    assert listeners[0]["n"] == 0
    clean_logs([*workers, api])
    # The operator commands through the pooler too (their connections honour the cache size).
    cli_env = {**POOLED, **DRILL_ENV}
    report = await asyncio.to_thread(run_cli, pooled, "queues", "--json", env=cli_env)
    assert report.returncode == 0, report.stderr
    counts = {q["name"]: q["counts"] for q in json.loads(report.stdout)["queues"]}
    assert counts[QUEUE]["completed"] == jobs
    listed = await asyncio.to_thread(
        run_cli, pooled, "jobs", "list", "--queue", QUEUE, "--limit", "3", "--json", env=cli_env
    )
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)["jobs"]) == 3
    sent = await asyncio.to_thread(run_cli, pooled, "send", QUEUE, "{}", env=cli_env)
    assert sent.returncode == 0, sent.stderr
    assert int(sent.stdout.strip()) > 0
    drill_report(
        f"drill 21 transaction pooler [{SCALE}: {bouncer.version()} pool_mode=transaction,"
        f" {bouncer.pool_size} server connections; api + 2 workers, LISTEN_MODE=poll, statement"
        f" cache 0]: {jobs} jobs sent by api_sender from 50 tasks in {send_seconds:.1f}s, all"
        f" run once (drained {drained:.1f}s after the last send); {len(event_ids)} events"
        f" ingested during a {outage:g}s hub outage ({failed_posts} failed posts), all delivered;"
        " no process exited, no prepared-statement or session error logged"
    )


async def test_eight_workers_boot_at_once_through_pgbouncer(
    empty_db_url: str, fleet: Fleet, bouncer: PgBouncer, drill_report
):
    """Eight workers starting at one instant through PgBouncer on an empty database (the
    install's session lock on the direct URL) install it once, are all ready, and run jobs
    sent through PgBouncer exactly once."""
    pooled = through(bouncer, empty_db_url)
    await create_ledger(empty_db_url)
    began = time.monotonic()
    daemons = await fleet.start_ready(
        pooled,
        {**POOLED, "DATABASE_DIRECT_URL": empty_db_url, "DATABASE_POOL_SIZE": "3"},
        count=8,
    )
    ready = time.monotonic() - began
    await check_installed_once(empty_db_url, daemons)
    ids, _ = await send_from_tasks(pooled, sized(200, 2_000), 20)

    async def all_done() -> bool:
        return not (await runs(empty_db_url, QUEUE)).missing(ids)

    await wait_for(all_done, sized(60, 300), "the jobs to run", step=0.5)
    assert (await runs(empty_db_url, QUEUE)).duplicates == {}
    assert fleet.running() == fleet.all, "a daemon exited"
    clean_logs(daemons)
    drill_report(
        f"drill 21 transaction pooler, boot [{SCALE}]: 8 workers at once on an empty database"
        f" through PgBouncer, installed once, all ready in {ready:.1f}s; {len(ids)} jobs run"
        " once; no session error logged"
    )
