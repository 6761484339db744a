"""The purge run lock: runs of one purge take turns, bounded waits, and no run goes on unguarded."""

from __future__ import annotations

import itertools
import time

import anyio
import asyncpg
import pytest

from worker.db.bounded import HandlerPool
from worker.db.locks import LockTimeout, session_lock
from worker.jobs.purges import AUDIT_PURGE_QUEUE, IDEMPOTENCY_PURGE_QUEUE
from worker.jobs.purges.exclusive import CHASSIS_SCHEMA, RunLockLost
from worker.jobs.purges.runs import PurgeBody, PurgeRun, run_purge

from .runner import SCHEMA, session_url


def timed(spans: list[tuple[str, float, float]], seconds: float) -> PurgeBody:
    """A purge body that works for ``seconds`` and records (queue, start, end)."""

    async def body(conn: asyncpg.Connection, run: PurgeRun) -> None:
        began = time.monotonic()
        await anyio.sleep(seconds)
        spans.append((run.queue, began, time.monotonic()))

    return body


async def purge(pool: asyncpg.Pool, queue: str, body: PurgeBody, **kwargs: float) -> PurgeRun:
    """Run ``body`` as a run of ``queue`` through the run wrapper and its lock."""
    url = await session_url(pool)
    return await run_purge(
        HandlerPool(pool, 4), SCHEMA, queue, None, body, session_url=url, **kwargs
    )


async def test_runs_of_one_purge_take_turns_and_other_purges_do_not_wait(
    pool: asyncpg.Pool,
) -> None:
    """Three runs of one purge started together run one after another; a run of another purge
    started with them runs beside them."""
    spans: list[tuple[str, float, float]] = []
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(purge, pool, AUDIT_PURGE_QUEUE, timed(spans, 0.4))
            tg.start_soon(purge, pool, IDEMPOTENCY_PURGE_QUEUE, timed(spans, 0.4))

    same = sorted((s, e) for q, s, e in spans if q == AUDIT_PURGE_QUEUE)
    assert len(same) == 3
    assert all(earlier[1] <= later[0] for earlier, later in itertools.pairwise(same))
    (other,) = [(s, e) for q, s, e in spans if q == IDEMPOTENCY_PURGE_QUEUE]
    assert other[0] < same[0][1], "another purge waited for this one"


async def test_a_run_gives_up_when_the_lock_stays_held_past_its_wait(pool: asyncpg.Pool) -> None:
    """While another session holds the purge's lock, a run waits its bounded time, then fails
    without running its body."""
    ran: list[tuple[str, float, float]] = []
    holder = await asyncpg.connect(await session_url(pool))
    try:
        async with session_lock(holder, f"purge:{AUDIT_PURGE_QUEUE}", CHASSIS_SCHEMA, timeout=5):
            with anyio.fail_after(10), pytest.raises(LockTimeout):
                await purge(pool, AUDIT_PURGE_QUEUE, timed(ran, 0), lock_wait=1.0)
    finally:
        await holder.close()
    assert ran == []


async def test_a_run_whose_lock_connection_dies_stops_instead_of_going_on_unguarded(
    pool: asyncpg.Pool,
) -> None:
    """When the backend holding a run's lock is terminated mid-run, the run is cancelled and
    fails (its job retries), and its body never finishes."""
    done: list[tuple[str, float, float]] = []
    working = anyio.Event()
    slow = timed(done, 30)

    async def body(conn: asyncpg.Connection, run: PurgeRun) -> None:
        working.set()
        await slow(conn, run)

    async def kill_the_lock() -> None:
        await working.wait()
        killed = await pool.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = $1",
            f"chassis-worker purge lock {AUDIT_PURGE_QUEUE}",
        )
        assert killed == 1

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_the_lock)
            with pytest.raises(RunLockLost):
                await purge(pool, AUDIT_PURGE_QUEUE, body)
    assert done == []
