"""Job management against running worker processes: pause across replicas, retry of an
exhausted job."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta

import asyncpg
import pytest

from api_sender import Sender
from tests.support.ledger import create_ledger
from tests.support.processes import Daemon, start_daemon

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("processes")]

WORK_ENV = {"TOOL_JOBS": "tests.support.tooljobs:WORK"}
#: FAST_TIMINGS' poll interval.
POLL = 0.5
#: A poll interval long enough that a start soon after resume can only come from its NOTIFY.
SLOW_POLL = {"POLL_INTERVAL_SECONDS": "30"}


async def rows(url: str, sql: str, *args: object) -> list[asyncpg.Record]:
    """Run a query on a fresh connection."""
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def wait_for(check, timeout: float) -> None:
    """Poll an async predicate until it holds, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not within {timeout}s")


async def wait_started(db_url: str, job_id: str) -> None:
    """Wait (15 s at most) until the job's handler has written its first ledger row."""

    async def started() -> bool:
        found = await rows(db_url, "SELECT 1 FROM public.ledger WHERE job_id = $1", job_id)
        return bool(found)

    await wait_for(started, 15)


def cancel_interrupted(daemon: Daemon, job_id: str) -> bool:
    """Whether ``daemon`` has logged ``job.cancel_interrupted`` for ``job_id``."""
    return any(
        e.get("event") == "job.cancel_interrupted" and e.get("job_id") == job_id
        for e in daemon.events()
    )


async def start_workers(db_url: str, tmp_path, n: int, **env: str) -> list[Daemon]:
    """``n`` worker processes running tool-work, all ready."""
    daemons = [
        start_daemon(db_url, tmp_path, name=f"w{i}", env={**WORK_ENV, **env}) for i in range(n)
    ]
    for daemon in daemons:
        await asyncio.to_thread(daemon.wait_ready, 60)
    return daemons


async def test_pause_stops_every_replica_and_resume_starts_them_at_once(
    db_url: str, tmp_path
) -> None:
    """Two replicas: after the pause commits none claims a job of the queue (so none starts one
    it claimed later), while sends still land; resume starts them at once, through NOTIFY (the
    replicas poll only every 30 s)."""
    await create_ledger(db_url)
    daemons = await start_workers(db_url, tmp_path, 2, **SLOW_POLL)
    try:
        async with Sender.connect(db_url, max_size=2) as sender:
            await sender.send_many("tool-work", [{"sleep": 0.3} for _ in range(16)])
            await asyncio.sleep(0.5)
            await sender.queues.pause("tool-work")
            [paused_at] = await rows(db_url, "SELECT now() AS t")
            paused: datetime = paused_at["t"]
            later = await sender.send_many("tool-work", [{"n": n} for n in range(20)])
            assert len(later) == 20
            await asyncio.sleep(3)
            claimed_after = await rows(
                db_url,
                "SELECT id FROM jobs.job WHERE queue = 'tool-work' AND started_at > $1",
                paused,
            )
            assert claimed_after == [], "a replica claimed a job of the paused queue"
            # A claim already under way when the pause committed may still start its jobs:
            # never more than a poll interval later.
            late_starts = await rows(
                db_url,
                "SELECT job_id FROM public.ledger WHERE phase = 'start' AND at > $1",
                paused + timedelta(seconds=POLL),
            )
            assert late_starts == []
            waiting = await rows(
                db_url, "SELECT id FROM jobs.job WHERE id = ANY($1) AND state = 'created'", later
            )
            assert len(waiting) == 20
            resumed = time.monotonic()
            await sender.queues.resume("tool-work")

            async def later_done() -> bool:
                done = await rows(
                    db_url,
                    "SELECT id FROM jobs.job WHERE id = ANY($1) AND state = 'completed'",
                    later,
                )
                return len(done) == 20

            # Within 15 s of the resume, with replicas that poll every 30 s: woken by NOTIFY.
            await wait_for(later_done, 15)
            assert time.monotonic() - resumed < 30
    finally:
        for daemon in daemons:
            daemon.stop()


async def test_retry_of_an_exhausted_job_runs_exactly_once_more(db_url: str, tmp_path) -> None:
    """A job that failed with no retries left runs once after ``jobs.retry`` and, failing again,
    ends failed: two runs in all, never a third."""
    await create_ledger(db_url)
    [daemon] = await start_workers(db_url, tmp_path, 1)
    try:
        async with Sender.connect(db_url, max_size=2) as sender:
            job_id = await sender.send("tool-work", {"fail": True}, retry_limit=0)
            assert job_id is not None

            async def failed() -> bool:
                job = await sender.jobs.get(job_id)
                return job is not None and job.state == "failed"

            await wait_for(failed, 15)
            assert await sender.jobs.retry([job_id]) == [job_id]
            await asyncio.sleep(0.2)
            await wait_for(failed, 15)
            await asyncio.sleep(3 * POLL)
            runs = await rows(
                db_url,
                "SELECT attempt FROM public.ledger WHERE job_id = $1 AND phase = 'start'"
                " ORDER BY seq",
                job_id,
            )
            assert [r["attempt"] for r in runs] == [1, 2]
    finally:
        daemon.stop()


async def test_cancel_interrupts_the_running_handler_on_its_replica_within_2_s(
    db_url: str, tmp_path
) -> None:
    """A job running in a worker process, cancelled from this process: its handler stops within
    2 seconds (NOTIFY to that replica), it never finishes or runs again, and stays cancelled;
    the worker goes on with other jobs."""
    await create_ledger(db_url)
    [daemon] = await start_workers(db_url, tmp_path, 1, **SLOW_POLL)
    try:
        async with Sender.connect(db_url, max_size=2) as sender:
            job_id = await sender.send("tool-work", {"sleep": 60})
            await wait_started(db_url, job_id)
            asked = time.monotonic()
            assert await sender.jobs.cancel([job_id]) == [job_id]
            while not cancel_interrupted(daemon, job_id):
                assert time.monotonic() - asked < 2.0, "the handler was not interrupted in 2 s"
                await asyncio.sleep(0.02)
            after = await sender.send("tool-work", {"n": 1})

            async def after_done() -> bool:
                job = await sender.jobs.get(after)  # type: ignore[arg-type]
                return job is not None and job.state == "completed"

            await wait_for(after_done, 15)
            phases = await rows(
                db_url, "SELECT phase FROM public.ledger WHERE job_id = $1 ORDER BY seq", job_id
            )
            assert [r["phase"] for r in phases] == ["start"]
            job = await sender.jobs.get(job_id)  # type: ignore[arg-type]
            assert job is not None
            assert job.state == "cancelled"
    finally:
        daemon.stop()
    assert not any(e.get("event") == "job.lease_lost" for e in daemon.events())
