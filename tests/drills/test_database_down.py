"""Drill 16: the database is down when the daemon boots, and read-only later on."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from api_sender import Sender, create_pool
from tests.drills.helpers import (
    SCALE,
    Fleet,
    Watch,
    create_ledger,
    fetch,
    log_events,
    metric,
    runs,
    sized,
    wait_for,
)
from tests.support.dbproxy import DatabaseProxy

#: At most two daemons: runs in the second drill lane, beside the multi-process drills.
pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills-light")]

QUEUE = "drill-work"
BACK_WITHIN = 10.0


async def terminate_all(admin: asyncpg.Connection, dbname: str) -> int:
    """Terminate every other backend of ``dbname``."""
    rows = await admin.fetch(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = $1 AND pid <> pg_backend_pid()",
        dbname,
    )
    return len(rows)


async def test_database_down_at_boot_then_read_only_loses_nothing(
    db_url: str, admin_url: str, fleet: Fleet, drill_report
):
    """Booted while its database is unreachable, the daemon stays up (/healthz 200, /readyz
    503) and is ready within 10 s of the database coming back; later, while new sessions are
    read-only, no job fails, and within 10 s of write access returning everything sent
    meanwhile has completed."""
    down_for = sized(5.0, 30.0)
    read_only_for = sized(5.0, 30.0)
    await create_ledger(db_url)
    dbname = db_url.rsplit("/", 1)[1]
    proxy = DatabaseProxy(db_url)
    admin = await asyncpg.connect(admin_url)
    try:
        proxy.cut()
        daemon = fleet.start(proxy.url)
        with Watch([daemon], paths=("/healthz", "/readyz")) as watch:
            # The outage counts from the listener's first answer: a boot slowed by a busy
            # machine must not eat the window in which the daemon has to answer 503.
            async def answering() -> bool:
                return any(s.status for s in watch.samples)

            await wait_for(answering, 60, "the HTTP listener to answer", step=0.05)
            await asyncio.sleep(down_for)
            restored = time.time()
            proxy.restore()
            await asyncio.to_thread(daemon.wait_ready, 60)
            ready_in = time.time() - restored
        # From the moment the listener answers (the process boots first).
        up = min(s.at for s in watch.samples if s.status)
        down = watch.of("/readyz", since=up, until=restored - 0.1)
        health = watch.of("/healthz", since=up, until=restored - 0.1)
        assert down, "nothing answered /readyz while the database was down"
        assert {s.status for s in down} == {503}
        assert {s.status for s in health} == {200}
        assert daemon.process.poll() is None
        retries = sum(
            len(log_events(daemon, name))
            for name in ("db.connect_retry", "install.retry", "db.unreachable")
        )
        assert 0 < retries < down_for * 10, f"{retries} connection attempts: a hot loop?"
        assert ready_in < BACK_WITHIN, f"ready {ready_in:.1f}s after the database came back"

        # Read-only for new sessions; the daemon's sessions are replaced by read-only ones.
        writer = await create_pool(
            db_url, min_size=1, max_size=1, server_settings={"default_transaction_read_only": "off"}
        )
        try:
            sender = Sender(writer)
            before = set(await sender.send_many(QUEUE, [{"sleep": 2.0}] * 8))

            async def running() -> bool:
                return len(set((await runs(db_url, QUEUE)).started) & before) == 8

            await wait_for(running, 30, "jobs to run before the switch", step=0.05)
            await admin.execute(f'ALTER DATABASE "{dbname}" SET default_transaction_read_only = on')
            terminated = await terminate_all(admin, dbname)
            switched = time.time()
            await asyncio.sleep(0.5)
            during = set(await sender.send_many(QUEUE, [{"sleep": 0.1}] * 20))
            await asyncio.sleep(read_only_for)
            await admin.execute(f'ALTER DATABASE "{dbname}" RESET default_transaction_read_only')
            writable = time.time()
            ids = before | during

            async def all_completed() -> bool:
                rows = await fetch(
                    db_url,
                    "SELECT count(*) FROM jobs.job WHERE id = ANY($1::bigint[])"
                    " AND state = 'completed'",
                    list(ids),
                )
                return int(rows[0][0]) == len(ids)

            recovered = await wait_for(all_completed, 60, "the jobs to complete after read-only")
        finally:
            await writer.close()
    finally:
        await admin.execute(f'ALTER DATABASE "{dbname}" RESET default_transaction_read_only')
        await admin.close()
        proxy.close()
    assert recovered < BACK_WITHIN, f"jobs completed {recovered:.1f}s after write access returned"
    rows = await fetch(
        db_url,
        "SELECT count(*) FROM jobs.job WHERE id = ANY($1::bigint[])"
        " AND (retry_count > 0 OR output IS NOT NULL)",
        list(ids),
    )
    assert int(rows[0][0]) == 0, "a read-only error failed a job"
    assert metric(daemon, "jobs_failed_total", queue=QUEUE) == 0
    ledger = await runs(db_url, QUEUE)
    assert ledger.missing(ids) == set()
    refused = len(log_events(daemon, "poller.claim_failed")) + len(
        log_events(daemon, "job.outcome_write_retry")
    )
    drill_report(
        f"drill 16 database down at boot, read-only later [{SCALE}]: booted with the database"
        f" unreachable for {down_for:g}s -> alive, /healthz 200, /readyz 503 ({len(down)} probes),"
        f" {retries} backed-off retries, ready {ready_in:.1f}s after it came back;"
        f" default_transaction_read_only=on for {read_only_for:g}s ({terminated} sessions"
        f" replaced) -> {refused} refused writes retried, 0 jobs failed, all"
        f" {len(ids)} completed {recovered:.1f}s after write access returned"
        f" ({writable - switched:.1f}s read-only); nothing lost"
    )
