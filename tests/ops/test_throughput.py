"""The per-minute tally behind the console's chart: counted from finished rows a minute or two
at a time, exact, idempotent, and read back as the last hour."""

from __future__ import annotations

import anyio
import asyncpg

from tests.support.queues import make_queue
from worker.http.admin.views import throughput
from worker.queue import throughput as tally_module
from worker.queue.throughput import Tally, tally


async def finish(pool: asyncpg.Pool, state: str, minutes_ago: int, n: int) -> None:
    """``n`` jobs of queue q finished ``minutes_ago`` minutes ago in ``state``."""
    await pool.execute(
        "INSERT INTO jobs.job (queue, state, retry_limit, retry_delay, retry_backoff,"
        " expire_seconds, completed_at) SELECT 'q', $1::text::jobs.job_state, 0, 0, false, 60,"
        " date_trunc('minute', now()) - make_interval(mins => $2) + interval '10 seconds'"
        " FROM generate_series(1, $3)",
        state,
        minutes_ago,
        n,
    )


async def tallied(pool: asyncpg.Pool) -> dict[int, tuple[int, int]]:
    """minutes ago -> (completed, failed), as tallied."""
    rows = await pool.fetch(
        "SELECT extract(epoch FROM date_trunc('minute', now()) - minute)::int / 60 AS ago,"
        " completed, failed FROM jobs.job_minute"
    )
    return {r["ago"]: (r["completed"], r["failed"]) for r in rows}


async def test_the_tally_counts_each_minute_and_catches_up_without_recounting_the_hour(
    pool: asyncpg.Pool,
) -> None:
    """A first tally counts the last hour per minute; a later one recounts only from the
    newest tallied minute on (older minutes keep their counts even after their rows go), and
    drops minutes older than a day."""
    await make_queue(pool, "q")
    await finish(pool, "completed", 30, 5)
    await finish(pool, "failed", 30, 2)
    await finish(pool, "completed", 2, 3)
    await finish(pool, "cancelled", 2, 4)
    await finish(pool, "completed", 90, 7)  # outside the first hour: never tallied
    async with pool.acquire() as conn:
        assert await tally(conn, "jobs", forget=True) == 2
    assert await tallied(pool) == {30: (5, 2), 2: (3, 0)}
    await pool.execute("DELETE FROM jobs.job WHERE completed_at < now() - interval '20 minutes'")
    await finish(pool, "completed", 2, 1)
    await finish(pool, "failed", 0, 1)
    await pool.execute(
        "INSERT INTO jobs.job_minute (minute, completed) VALUES (now() - interval '2 days', 9)"
    )
    async with pool.acquire() as conn:
        assert await tally(conn, "jobs", forget=True) == 2
        assert await tally(conn, "jobs", forget=True) == 0
    assert await tallied(pool) == {30: (5, 2), 2: (4, 0), 0: (0, 1)}


async def test_the_chart_reads_sixty_minutes_and_tallies_itself_when_no_worker_has(
    pool: asyncpg.Pool,
) -> None:
    """With no tally at all, the console's read brings it up to date and returns the last 60
    minutes oldest first, zeros where nothing finished."""
    await make_queue(pool, "q")
    await finish(pool, "completed", 5, 4)
    await finish(pool, "failed", 0, 2)
    minutes = await throughput(pool, "jobs")
    assert len(minutes) == 60
    assert [(m.completed, m.failed) for m in minutes[-6:]] == [
        (4, 0),
        (0, 0),
        (0, 0),
        (0, 0),
        (0, 0),
        (0, 2),
    ]
    assert sum(m.completed + m.failed for m in minutes) == 6


async def test_a_worker_tallies_only_after_it_finished_jobs(
    pool: asyncpg.Pool, monkeypatch
) -> None:
    """The tally task writes nothing until told jobs finished, then tallies once."""
    await make_queue(pool, "q")
    await finish(pool, "completed", 1, 3)
    monkeypatch.setattr(tally_module, "TALLY_SECONDS", 0.05)
    worker = Tally(pool, "jobs")
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await anyio.sleep(0.3)
        assert await tallied(pool) == {}
        worker.finished()
        with anyio.fail_after(5):
            while not await tallied(pool):
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    assert await tallied(pool) == {1: (3, 0)}
