"""Drill 16b: statement timeouts and deadlocks met by the worker's loops are retried, not fatal."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from api_sender import Sender
from tests.drills.helpers import (
    SCALE,
    Fleet,
    create_ledger,
    fetch,
    runs,
    sized,
    wait_for,
)
from tests.support.processes import Daemon

#: One daemon: runs in the second drill lane, beside the multi-process drills.
pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills-light")]

QUEUE = "drill-work"
#: The work queue and a per-second cron, so the cron loop meets the faults too.
ENV = {"TOOL_JOBS": "tests.support.tooljobs:DRILL,tests.support.tooljobs:DRILL_CRON"}

#: Makes every write to the job and worker tables fail with a real deadlock error (40P01).
DEADLOCK = """
CREATE FUNCTION public.drill_deadlock() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'deadlock injected by the drill' USING ERRCODE = '40P01'; END $$;
CREATE TRIGGER drill_deadlock BEFORE UPDATE ON jobs.job
    FOR EACH ROW EXECUTE FUNCTION public.drill_deadlock();
CREATE TRIGGER drill_deadlock BEFORE INSERT OR UPDATE ON jobs.worker
    FOR EACH ROW EXECUTE FUNCTION public.drill_deadlock();
"""
UNDO_DEADLOCK = """
DROP TRIGGER drill_deadlock ON jobs.job;
DROP TRIGGER drill_deadlock ON jobs.worker;
"""


def errors_met(daemon: Daemon, name: str) -> dict[str, int]:
    """Log event -> how many of its lines report an error of class ``name``."""
    met: dict[str, int] = {}
    for event in daemon.events():
        if str(event.get("error", "")).startswith(name):
            met[event["event"]] = met.get(event["event"], 0) + 1
    return met


async def completed(url: str, ids: set[int], daemon: Daemon) -> bool:
    """Whether every job of ``ids`` has completed (failing at once if the worker exited)."""
    code = daemon.process.poll()
    assert code is None, f"the worker exited {code}:\n{daemon.logs()[-3000:]}"
    rows = await fetch(
        url,
        "SELECT count(*) FROM jobs.job WHERE id = ANY($1::bigint[]) AND state = 'completed'",
        list(ids),
    )
    return int(rows[0][0]) == len(ids)


async def test_statement_timeouts_and_deadlocks_are_retried(
    db_url: str, admin_url: str, fleet: Fleet, drill_report
):
    """With statement_timeout = 1s on the database, a 3 s lock on the job, schedule and worker
    tables cancels the probe's, the pollers', the heartbeat's and the cron loop's statements,
    and later every write to those tables fails as a deadlock for a while: the worker stays up
    and ready, and processes every job sent after each fault."""
    locked_for = 3.0
    deadlocked_for = sized(3.0, 10.0)
    jobs = sized(20, 200)
    await create_ledger(db_url)
    dbname = db_url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f"ALTER DATABASE \"{dbname}\" SET statement_timeout = '1s'")
        [daemon] = await fleet.start_ready(db_url, ENV)
        conn = await asyncpg.connect(db_url, server_settings={"statement_timeout": "0"})
        try:
            async with Sender.connect(db_url, max_size=1) as sender:
                # A job running through each fault, so the worker holds one and beats.
                holding = set(await sender.send_many(QUEUE, [{"sleep": locked_for + 3}]))

                async def started() -> bool:
                    return holding <= set((await runs(db_url, QUEUE)).started)

                await wait_for(started, 30, "the long job to start", step=0.05)
                async with conn.transaction():
                    await conn.execute(
                        "LOCK TABLE jobs.job, jobs.schedule, jobs.worker IN ACCESS EXCLUSIVE MODE"
                    )
                    await asyncio.sleep(locked_for)
                after_lock = set(await sender.send_many(QUEUE, [{"n": n} for n in range(jobs)]))
                await wait_for(
                    lambda: completed(db_url, holding | after_lock, daemon),
                    60,
                    "jobs after the lock",
                )
                cancelled = errors_met(daemon, "QueryCanceledError")

                holding = set(await sender.send_many(QUEUE, [{"sleep": deadlocked_for + 2}]))
                await wait_for(started, 30, "the second long job to start", step=0.05)
                await conn.execute(DEADLOCK)
                during = set(await sender.send_many(QUEUE, [{"n": n} for n in range(jobs)]))
                await asyncio.sleep(deadlocked_for)
                await conn.execute(UNDO_DEADLOCK)
                after = set(await sender.send_many(QUEUE, [{"n": n} for n in range(jobs)]))
                await wait_for(
                    lambda: completed(db_url, holding | during | after, daemon),
                    60,
                    "jobs after the deadlocks",
                )
                deadlocks = errors_met(daemon, "DeadlockDetectedError")
        finally:
            await conn.close()
    finally:
        await admin.execute(f'ALTER DATABASE "{dbname}" RESET statement_timeout')
        await admin.close()
    assert daemon.process.poll() is None, f"the worker exited:\n{daemon.logs()[-3000:]}"
    status, _ = daemon.get("/readyz")
    assert status == 200
    assert "listener.probe_failed" in cancelled, f"the probe never met the timeout: {cancelled}"
    assert "cron.failed" in cancelled, f"the cron loop never met the timeout: {cancelled}"
    assert "poller.claim_failed" in deadlocks, f"no claim met the deadlock: {deadlocks}"
    drill_report(
        f"drill 16b statement timeout and deadlock [{SCALE}]: statement_timeout=1s and a"
        f" {locked_for:g}s lock on the job, schedule and worker tables -> retried"
        f" ({', '.join(f'{k} {v}' for k, v in sorted(cancelled.items()))}); 40P01 on every job"
        f" and worker write for {deadlocked_for:g}s -> retried"
        f" ({', '.join(f'{k} {v}' for k, v in sorted(deadlocks.items()))}); the worker stayed"
        f" up and ready, and completed all {3 * jobs + 2} jobs sent around the faults"
    )
