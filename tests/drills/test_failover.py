"""Drill 20: primary failover. A primary and a streaming standby of the drill's own (initdb,
``pg_basebackup -R``, loopback ports), an api and two workers on the two-host URL
``...@127.0.0.1:P1,127.0.0.1:P2/db?target_session_attrs=read-write``; jobs sent with Sender
and usage events through the ingest throughout; the primary's postmaster SIGKILLed mid-load
and the standby promoted (``pg_ctl promote``).

With synchronous replication (``synchronous_standby_names`` set on the primary after the base
backup) every acknowledged send and 202'd event must be processed afterwards. With
asynchronous replication the drill reports what was lost: the figure behind the docs' advice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import asyncpg
import httpx
import pytest

from api_sender import Sender, new_ulid
from tests.drills.helpers import SCALE, Fleet, Watch, create_ledger, fetch, runs, sized, wait_for
from tests.support.hub import Hub
from tests.support.processes import Daemon
from tests.support.servers import ReplicatedPair, postgres_bin, scratch_dir

pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills")]

QUEUE = "drill-work"
TOKEN = "drill-ingest-token"
DATABASE = "chassis"
#: Every process must be ready again this soon after the promotion (contract section 12 and
#: RELIABILITY.md drill 20).
READY_WITHIN = 15.0
#: Seconds after the promotion by which every handler running at the kill has written its first
#: ledger line (the drill ledger retries a write every 0.2 s until a server takes it).
IN_FLIGHT_GRACE = 5.0
#: How long the primary's WAL sender is held just before the kill: the standby falls behind
#: as over a slow link. Synchronous commits wait meanwhile; asynchronous ones go on without it.
LAG_SECONDS = sized(1.0, 3.0)


@contextlib.contextmanager
def replicated(synchronous: bool) -> Iterator[ReplicatedPair]:
    """A primary and its standby, each on a port of its own, removed afterwards."""
    binaries = postgres_bin()
    with scratch_dir("chassis-failover-") as directory:
        pair = ReplicatedPair(binaries, directory, synchronous=synchronous)
        try:
            yield pair.start()
        finally:
            pair.stop()


@dataclass
class Traffic:
    """Jobs sent with Sender and events posted to the ingest while it runs; only what got an
    answer (an id, a 202) is kept."""

    url: str
    ingest: str
    #: job id -> the send's serial number (in the job's data) and when it was answered.
    jobs: dict[int, tuple[int, float]] = field(default_factory=dict)
    #: event id -> when its request was answered 202.
    events: dict[str, float] = field(default_factory=dict)
    send_errors: int = 0
    post_refusals: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def __aenter__(self) -> Traffic:
        self._tasks = [asyncio.create_task(self._send()), asyncio.create_task(self._post())]
        return self

    async def __aexit__(self, *_: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)

    async def _send(self) -> None:
        rng = random.Random(20)
        n = 0
        sender: Sender | None = None
        while not self._stop.is_set():
            try:
                if sender is None:
                    sender = await asyncio.wait_for(
                        Sender.connect(self.url, min_size=1, max_size=1).open(), timeout=5
                    )
                items = [{"n": n + i, "sleep": round(rng.uniform(0.05, 0.3), 2)} for i in range(5)]
                ids = await asyncio.wait_for(sender.send_many(QUEUE, items), timeout=5)
                now = time.time()
                for item, job_id in zip(items, ids, strict=True):
                    self.jobs[job_id] = (int(item["n"]), now)
                n += len(items)
            except Exception:
                self.send_errors += 1
                if sender is not None:
                    sender.pool.terminate()
                    sender = None
            await self._pause(0.1)
        if sender is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(sender.close(), timeout=5)

    async def _post(self) -> None:
        async with httpx.AsyncClient(timeout=5) as client:
            while not self._stop.is_set():
                batch = [
                    {
                        "id": new_ulid(),
                        "meter": "api.calls",
                        "quantity": 1,
                        "workspace_id": "w1",
                        "occurred_at": "2026-01-01T00:00:00Z",
                    }
                    for _ in range(10)
                ]
                try:
                    response = await client.post(
                        self.ingest,
                        json={"events": batch},
                        headers={"Authorization": f"Bearer {TOKEN}"},
                    )
                    if response.status_code == 202:
                        now = time.time()
                        self.events.update((str(e["id"]), now) for e in batch)
                    else:
                        self.post_refusals += 1
                except httpx.HTTPError:
                    self.post_refusals += 1
                await self._pause(0.1)


def ready_again_after(watch: Watch, daemon: Daemon, since: float) -> float | None:
    """Seconds from ``since`` until ``daemon``'s /readyz answered 200 for good (every later
    answer 200); ``None`` if it never did."""
    samples = sorted(
        (s for s in watch.of("/readyz", since=since) if s.pid == daemon.pid), key=lambda s: s.at
    )
    if not samples or samples[-1].status != 200:
        return None
    last_bad = max((s.at for s in samples if s.status != 200), default=None)
    if last_bad is None:
        return 0.0
    good = [s.at + s.seconds for s in samples if s.at > last_bad and s.status == 200]
    return min(good) - since if good else None


def all_json(daemons: list[Daemon]) -> list[str]:
    """Lines any daemon wrote that are not JSON events (asyncpg's plain-text tracebacks)."""
    bad = []
    for daemon in daemons:
        for line in daemon.logs().splitlines():
            try:
                ok = isinstance(json.loads(line), dict)
            except ValueError:
                ok = False
            if not ok:
                bad.append(line)
    return bad


@dataclass
class Outcome:
    """What one failover did."""

    traffic: Traffic
    in_flight: set[int]
    kill_to_promoted: float
    #: WAL bytes the standby had not replayed just before the kill.
    lag_bytes: int
    kill_to_first_completion: float | None
    #: Seconds from the promotion until each daemon answered /readyz 200 for good.
    ready_after: dict[int, float | None]
    #: The same from the kill.
    ready_after_kill: dict[int, float | None]
    missing_jobs: set[int]
    mismatched_jobs: set[int]
    duplicates: dict[int, int]
    missing_events: set[str]
    exited: list[int]
    non_json: list[str]


async def failover(
    pair: ReplicatedPair,
    fleet: Fleet,
    hub: Hub,
    *,
    settle_for: float,
    wait: float,
    lag_for: float = LAG_SECONDS,
) -> Outcome:
    """Start the daemons on the two-host URL, load them, hold the primary's WAL sender
    (SIGSTOP) for ``lag_for`` seconds as a slow link would, kill the whole primary mid-load,
    promote the standby, load on, then wait (at most ``wait`` s) for every acknowledged job
    and event."""
    await pair.primary.create_database(DATABASE)
    url = pair.url(DATABASE)
    await create_ledger(url)
    usage = {
        **hub.env(),
        "USAGE_BATCH_SIZE": "50",
        "USAGE_RETRY_DELAY_SECONDS": "0",
        "USAGE_HELD_DELAY_SECONDS": "1",
    }
    workers = await fleet.start_ready(url, usage, count=2)
    [api] = await fleet.start_ready(url, {"INGEST_TOKEN": TOKEN}, role="api")
    daemons = [*workers, api]
    with Watch(daemons, paths=("/readyz",), every=0.2, timeout=2.0) as watch:
        async with Traffic(url, api.url("/v1/usage-events")) as traffic:
            await asyncio.sleep(settle_for)
            sender = await fetch(pair.primary.url(), "SELECT pid FROM pg_stat_replication")
            os.kill(int(sender[0]["pid"]), signal.SIGSTOP)
            await asyncio.sleep(lag_for)
            lag = await fetch(
                pair.primary.url(),
                "SELECT coalesce(max(pg_current_wal_lsn() - replay_lsn), 0)::bigint AS behind"
                " FROM pg_stat_replication",
            )
            killed = time.time()
            pair.primary.kill()
            await asyncio.to_thread(pair.standby.promote)
            promoted = time.time()
            await asyncio.sleep(max(READY_WITHIN + 2.0, settle_for))
        # Everything acknowledged should now run and arrive; wait while it still progresses.
        deadline = time.monotonic() + wait
        ids = set(traffic.jobs)
        ledger = await runs(url, QUEUE)
        while time.monotonic() < deadline and (
            ledger.missing(ids) or not set(traffic.events) <= hub.accepted_ids()
        ):
            await asyncio.sleep(1.0)
            ledger = await runs(url, QUEUE)
        ready_after = {d.pid: ready_again_after(watch, d, promoted) for d in daemons}
        ready_after_kill = {d.pid: ready_again_after(watch, d, killed) for d in daemons}
    rows = await fetch(
        url,
        "SELECT id, (data->>'n')::int AS n FROM jobs.job WHERE queue = $1 AND id = ANY($2)",
        QUEUE,
        list(ids),
    )
    found = {row["id"]: row["n"] for row in rows}
    mismatched = {job for job, (n, _) in traffic.jobs.items() if found.get(job, n) != n}
    first = await fetch(
        url,
        "SELECT extract(epoch FROM min(completed_at))::float8 AS t FROM jobs.job"
        " WHERE completed_at > to_timestamp($1)",
        killed,
    )
    # In flight at the kill: claimed before it. A handler whose first ledger line met the dead
    # primary writes it once the new one takes writes, so a claim from before the kill has its
    # first line by the promotion plus IN_FLIGHT_GRACE at the latest.
    started = await fetch(
        url,
        "SELECT job_id FROM public.drill_ledger WHERE phase = 'start'"
        " GROUP BY job_id HAVING min(at) < to_timestamp($1)",
        promoted + IN_FLIGHT_GRACE,
    )
    return Outcome(
        traffic=traffic,
        in_flight={row["job_id"] for row in started},
        kill_to_promoted=promoted - killed,
        lag_bytes=int(lag[0]["behind"]),
        kill_to_first_completion=None if first[0]["t"] is None else first[0]["t"] - killed,
        ready_after=ready_after,
        ready_after_kill=ready_after_kill,
        missing_jobs=ledger.missing(ids),
        mismatched_jobs=mismatched,
        duplicates=ledger.duplicates,
        missing_events=set(traffic.events) - hub.accepted_ids(),
        exited=[d.pid for d in fleet.all if d.process.poll() is not None],
        non_json=all_json(daemons),
    )


async def test_failover_with_a_synchronous_standby_loses_nothing(
    fleet: Fleet, hub: Hub, drill_report
):
    """Every acknowledged send and 202'd event is processed after the failover, duplicates only
    for jobs in flight at the kill, no process exits, each is ready again within 15 s of the
    promotion, and every log line is a JSON event."""
    with replicated(synchronous=True) as pair:
        out = await failover(pair, fleet, hub, settle_for=sized(4.0, 20.0), wait=sized(90, 300))
    assert out.exited == [], f"daemons exited: {out.exited}"
    assert not out.missing_jobs, f"{len(out.missing_jobs)} acknowledged jobs never ran"
    assert not out.mismatched_jobs, f"{len(out.mismatched_jobs)} ids now name other jobs"
    assert not out.missing_events, f"{len(out.missing_events)} accepted events never delivered"
    outside = set(out.duplicates) - out.in_flight
    assert not outside, f"jobs ran twice that were not in flight at the kill: {sorted(outside)}"
    slow = {pid: s for pid, s in out.ready_after.items() if s is None or s > READY_WITHIN}
    assert not slow, f"not ready within {READY_WITHIN:g}s of the promotion: {slow}"
    assert out.non_json == [], f"non-JSON log lines: {out.non_json[:5]}"
    assert out.kill_to_first_completion is not None, "no job completed on the new primary"
    ready = max(s for s in out.ready_after_kill.values() if s is not None)
    drill_report(
        f"drill 20 primary failover, synchronous standby [{SCALE}]: replication held"
        f" {LAG_SECONDS:g}s ({out.lag_bytes} WAL bytes behind), then SIGKILL of the primary,"
        f" promoted {out.kill_to_promoted:.1f}s later ({out.traffic.send_errors} sends and"
        f" {out.traffic.post_refusals} posts refused meanwhile, retried);"
        f" {len(out.traffic.jobs)} of"
        f" {len(out.traffic.jobs)} acknowledged jobs ran, {len(out.traffic.events)} of"
        f" {len(out.traffic.events)} accepted events delivered, {len(out.duplicates)} in-flight"
        f" jobs ran twice; kill -> first job completed on the new primary"
        f" {out.kill_to_first_completion:.1f}s; all 3 processes ready for good {ready:.1f}s"
        " after the kill; none exited; every log line JSON"
    )


async def test_failover_with_an_asynchronous_standby_reports_what_was_lost(
    fleet: Fleet, hub: Hub, drill_report
):
    """The same failover with asynchronous replication: what the promoted standby never got is
    lost. Reported, not asserted (beyond no process exiting): the honest figure behind the
    docs' advice to replicate synchronously."""
    with replicated(synchronous=False) as pair:
        out = await failover(pair, fleet, hub, settle_for=sized(4.0, 20.0), wait=sized(30, 120))
    assert out.exited == [], f"daemons exited: {out.exited}"
    lost_jobs = out.missing_jobs | out.mismatched_jobs
    drill_report(
        f"drill 20 primary failover, asynchronous standby [{SCALE}]: replication held"
        f" {LAG_SECONDS:g}s, {out.lag_bytes} WAL bytes behind at the kill; lost"
        f" {len(lost_jobs)} of {len(out.traffic.jobs)} acknowledged jobs"
        f" ({len(out.mismatched_jobs)} of those ids reissued to other jobs) and"
        f" {len(out.missing_events)} of {len(out.traffic.events)} accepted events;"
        f" {len(out.duplicates)} jobs ran twice; kill -> first completion"
        f" {out.kill_to_first_completion or float('nan'):.1f}s; no process exited"
    )


async def _completed_on(url: str, ids: list[int]) -> int:
    rows = await fetch(
        url,
        "SELECT count(*) AS n FROM jobs.job WHERE id = ANY($1) AND state = 'completed'",
        ids,
    )
    return int(rows[0]["n"])


async def test_a_primary_turning_read_only_is_left_for_the_promoted_standby(
    fleet: Fleet, drill_report
):
    """A primary that stays up but turns read-only (``default_transaction_read_only`` on, as a
    demotion leaves it) is left at once: with no writable host the processes are not ready
    but none exits; once the standby is promoted every one is back on it within 10 s and jobs
    sent there run."""
    with replicated(synchronous=False) as pair:
        await pair.primary.create_database(DATABASE)
        url = pair.url(DATABASE)
        await create_ledger(url)
        workers = await fleet.start_ready(url, count=2)
        [api] = await fleet.start_ready(url, {"INGEST_TOKEN": TOKEN}, role="api")
        daemons = [*workers, api]
        async with Sender.connect(url, max_size=1) as sender:
            before = await sender.send_many(QUEUE, [{"n": n} for n in range(20)])
        primary = pair.primary.url(DATABASE)

        async def ran_before() -> bool:
            return await _completed_on(primary, before) == len(before)

        await wait_for(ran_before, 30, "the first jobs to run")
        with Watch(daemons, paths=("/readyz",), every=0.2, timeout=2.0) as watch:
            admin = await asyncpg.connect(pair.primary.url())
            try:
                await admin.execute("ALTER SYSTEM SET default_transaction_read_only = on")
                await admin.execute("SELECT pg_reload_conf()")
            finally:
                await admin.close()
            demoted = time.time()

            def left(daemon: Daemon) -> bool:
                return any(
                    "no longer read-write" in str(e.get("error", ""))
                    for e in daemon.events()
                    if e.get("event") == "listener.lost"
                )

            async def workers_left() -> bool:
                return all(left(w) for w in workers)

            took_to_leave = await wait_for(workers_left, 10, "the listeners to leave")
            await asyncio.sleep(1.0)
            await asyncio.to_thread(pair.standby.promote)
            promoted = time.time()

            async def all_ready() -> bool:
                return all(d.get("/readyz", timeout=1.0)[0] == 200 for d in daemons)

            await wait_for(all_ready, 10, "every process ready on the new primary")
            async with Sender.connect(url, max_size=1) as sender:
                after = await sender.send_many(QUEUE, [{"n": n} for n in range(20)])
            new_primary = pair.standby.url(DATABASE)

            async def ran_after() -> bool:
                return await _completed_on(new_primary, after) == len(after)

            await wait_for(ran_after, 10, "jobs sent after the promotion to run on it")
            back = {d.pid: ready_again_after(watch, d, promoted) for d in daemons}
            not_ready = [
                s for s in watch.of("/readyz", since=demoted, until=promoted) if s.status != 200
            ]
        assert [d.pid for d in fleet.all if d.process.poll() is not None] == []
        assert not_ready, "no process said it was not ready while no host was writable"
        slow = {pid: s for pid, s in back.items() if s is None or s > 10.0}
        assert not slow, f"not back within 10 s of the promotion: {slow}"
        assert all_json(daemons) == []
    drill_report(
        f"drill 20 demoted primary [{SCALE}]: the primary turned read-only and stayed up; both"
        f" workers' listeners left it within {took_to_leave:.1f}s, nobody ready meanwhile, none"
        f" exited; the standby promoted -> all 3 ready within"
        f" {max(s for s in back.values() if s is not None):.1f}s, and {len(after)} jobs sent"
        " then ran on it"
    )
