"""Work across real processes: exactly-once under no faults, rescue after SIGKILL, graceful stop."""

from __future__ import annotations

import asyncio
import signal
import time
from datetime import timedelta

import asyncpg
import pytest

from api_sender import Sender
from tests.support.ledger import create_ledger, done_counts
from tests.support.processes import start_daemon

#: Tests running several daemons at once take turns (the "processes" group); one daemon needs none.
pytestmark = [pytest.mark.slow]

WORK_ENV = {"TOOL_JOBS": "tests.support.tooljobs:WORK"}
WIDE_ENV = {"TOOL_JOBS": "tests.support.tooljobs:WORK_WIDE"}


async def wait_for(predicate, timeout: float, step: float = 0.2) -> None:
    """Poll an async predicate until it holds or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(step)
    raise AssertionError(f"condition not met within {timeout}s")


async def count(url: str, sql: str, *args: object) -> int:
    """Run a count query on a fresh connection."""
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval(sql, *args))
    finally:
        await conn.close()


@pytest.mark.xdist_group("processes")
async def test_ten_thousand_jobs_over_four_processes_run_exactly_once(db_url: str, tmp_path):
    """10,000 jobs consumed by 4 worker processes at once: each completes exactly once."""
    await create_ledger(db_url)
    daemons = [start_daemon(db_url, tmp_path, name=f"w{i}", env=WIDE_ENV) for i in range(4)]
    try:
        for d in daemons:
            await asyncio.to_thread(d.wait_ready, 60)
        async with Sender.connect(db_url, max_size=2) as sender:
            for start in range(0, 10_000, 1_000):
                await sender.send_many("tool-work", [{"n": n} for n in range(start, start + 1000)])

        async def all_done() -> bool:
            return (
                await count(
                    db_url,
                    "SELECT count(*) FROM jobs.job WHERE queue = 'tool-work'"
                    " AND state = 'completed'",
                )
                == 10_000
            )

        await wait_for(all_done, 120)
        done = await done_counts(db_url, "tool-work")
        assert len(done) == 10_000
        assert set(done.values()) == {1}
        pids = await count(db_url, "SELECT count(DISTINCT pid) FROM public.ledger")
        assert pids == 4
    finally:
        for d in daemons:
            d.kill()


@pytest.mark.xdist_group("processes")
async def test_sigkilled_workers_jobs_complete_elsewhere_within_a_minute(db_url: str, tmp_path):
    """SIGKILL a worker mid-batch: its jobs come back and complete on another replica in < 60 s."""
    await create_ledger(db_url)
    victim = start_daemon(db_url, tmp_path, name="victim", env=WORK_ENV)
    await asyncio.to_thread(victim.wait_ready, 60)
    async with Sender.connect(db_url, max_size=2) as sender:
        ids = await sender.send_many("tool-work", [{"sleep": 3} for _ in range(8)])

    async def victim_busy() -> bool:
        return (
            await count(db_url, "SELECT count(*) FROM public.ledger WHERE pid = $1", victim.pid)
            >= 4
        )

    await wait_for(victim_busy, 30)
    victim.kill()
    killed_at = time.monotonic()
    survivor = start_daemon(db_url, tmp_path, name="survivor", env=WORK_ENV)
    try:
        await asyncio.to_thread(survivor.wait_ready, 60)

        async def all_done() -> bool:
            return len(await done_counts(db_url, "tool-work")) == len(ids)

        await wait_for(all_done, 60)
        assert time.monotonic() - killed_at < 60
        done = await done_counts(db_url, "tool-work")
        assert set(done) == set(ids)
        # At least once: only jobs the victim had started may have run twice.
        conn = await asyncpg.connect(db_url)
        try:
            in_flight = {
                r["job_id"]
                for r in await conn.fetch(
                    "SELECT job_id FROM public.ledger WHERE pid = $1", victim.pid
                )
            }
        finally:
            await conn.close()
        assert {job for job, n in done.items() if n > 1} <= in_flight
        rescued = await count(
            db_url, "SELECT count(*) FROM jobs.job WHERE output->>'error' LIKE 'rescued%'"
        )
        assert rescued >= 4
    finally:
        survivor.kill()


async def test_sigterm_lets_a_running_handler_finish_and_exits_zero(db_url: str, tmp_path):
    """SIGTERM while a 2 s handler runs (grace 5 s): it finishes, the process exits 0."""
    await create_ledger(db_url)
    daemon = start_daemon(db_url, tmp_path, env=WORK_ENV)
    await asyncio.to_thread(daemon.wait_ready, 60)
    async with Sender.connect(db_url, max_size=2) as sender:
        job_id = await sender.send("tool-work", {"sleep": 2})

    async def started() -> bool:
        return (
            await count(db_url, "SELECT count(*) FROM public.ledger WHERE job_id = $1", job_id) == 1
        )

    await wait_for(started, 30, step=0.05)
    signalled = time.monotonic()
    daemon.signal(signal.SIGTERM)
    code = await asyncio.to_thread(daemon.wait, 15)
    assert code == 0, daemon.logs()
    assert time.monotonic() - signalled < 5
    assert await done_counts(db_url, "tool-work") == {job_id: 1}
    state = await count(
        db_url, "SELECT count(*) FROM jobs.job WHERE id = $1 AND state = 'completed'", job_id
    )
    assert state == 1


@pytest.mark.xdist_group("processes")
async def test_handler_outliving_the_grace_is_handed_back_and_runs_elsewhere(db_url, tmp_path):
    """A handler still running when the grace ends is interrupted, its job handed back at once
    without losing an attempt, and it runs again on another worker; the process exits 0."""
    await create_ledger(db_url)
    first = start_daemon(db_url, tmp_path, name="first", env=WORK_ENV)
    await asyncio.to_thread(first.wait_ready, 60)
    async with Sender.connect(db_url, max_size=2) as sender:
        job_id = await sender.send("tool-work", {"sleep": 8}, retry_limit=0)

    async def started() -> bool:
        return (
            await count(db_url, "SELECT count(*) FROM public.ledger WHERE job_id = $1", job_id) == 1
        )

    await wait_for(started, 30, step=0.05)
    signalled = time.monotonic()
    first.signal(signal.SIGTERM)
    assert await asyncio.to_thread(first.wait, 20) == 0, first.logs()
    assert time.monotonic() - signalled < 5 + 3
    conn = await asyncpg.connect(db_url)
    try:
        row = await conn.fetchrow(
            "SELECT state::text, retry_count, start_after <= now() AS due FROM jobs.job"
            " WHERE id = $1",
            job_id,
        )
    finally:
        await conn.close()
    assert (row["state"], row["retry_count"], row["due"]) == ("retry", 0, True)
    second = start_daemon(db_url, tmp_path, name="second", env=WORK_ENV)
    try:
        await asyncio.to_thread(second.wait_ready, 60)

        async def done() -> bool:
            return await done_counts(db_url, "tool-work") == {job_id: 1}

        await wait_for(done, 30)
    finally:
        second.kill()


async def test_idle_worker_writes_nothing_and_beats_only_while_holding_jobs(db_url, tmp_path):
    """An idle worker commits about one read-only probe per poll interval and writes no
    heartbeat; once it holds a job its heartbeat row appears."""
    await create_ledger(db_url)
    daemon = start_daemon(db_url, tmp_path, env=WORK_ENV)
    try:
        await asyncio.to_thread(daemon.wait_ready, 60)
        # Backends report their counters up to 10 s late (PGSTAT_IDLE_INTERVAL): let the boot's
        # own transactions land before measuring.
        await asyncio.sleep(11)
        conn = await asyncpg.connect(db_url)
        try:
            stats = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            before = await conn.fetchval(stats)
            await asyncio.sleep(6)
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            after = await conn.fetchval(stats)
            assert await conn.fetchval("SELECT count(*) FROM jobs.worker") == 0
        finally:
            await conn.close()
        # POLL_INTERVAL_SECONDS=0.5 over 6 s: 12 probes for all 7 queues together. The database
        # counter also sees our own statements and autovacuum, so allow slack; polling each
        # queue on its own would be 84. `make bench` measures the exact figure.
        assert after - before <= 24, after - before
        async with Sender.connect(db_url, max_size=1) as sender:
            await sender.send("tool-work", {"sleep": 1.5})

        async def beating() -> bool:
            return await count(db_url, "SELECT count(*) FROM jobs.worker") == 1

        await wait_for(beating, 10, step=0.1)
    finally:
        daemon.kill()


async def test_timer_runs_when_due_with_its_key(db_url: str, tmp_path) -> None:
    """A keyed timer 1.5 s out runs once, close to its instant, and its handler sees the key."""
    await create_ledger(db_url)
    daemon = start_daemon(
        db_url,
        tmp_path,
        env={"TOOL_JOBS": "tests.support.tooljobs:TIMERS", "POLL_INTERVAL_SECONDS": "5"},
    )
    try:
        await asyncio.to_thread(daemon.wait_ready, 60)
        async with Sender.connect(db_url, max_size=1) as sender:
            job_id = await sender.timers.schedule(
                "tool-timer", delay_seconds=1.5, data={"x": 1}, key="reminder-7"
            )
        conn = await asyncpg.connect(db_url)
        try:
            due = await conn.fetchval("SELECT start_after FROM jobs.job WHERE id = $1", job_id)

            async def ran() -> bool:
                return (
                    await count(db_url, "SELECT count(*) FROM public.ledger WHERE phase = 'done'")
                    == 1
                )

            await wait_for(ran, 15, step=0.05)
            row = await conn.fetchrow("SELECT key, at FROM public.ledger WHERE phase = 'start'")
        finally:
            await conn.close()
        assert row["key"] == "reminder-7"
        # Picked up at its instant, not at the next 5 s poll.
        assert timedelta(0) <= row["at"] - due < timedelta(seconds=1)
    finally:
        daemon.kill()
