"""The per-queue gauges (jobs per state, oldest waiting job), refreshed when /metrics is scraped.

The count (``counts`` in worker/queue/sql.py) reads the finished states from the counters of
migration 0005 and the waiting and active ones through their partial indexes, so it stays cheap
however many finished jobs are retained. A scrape still never waits on it for longer than
``SCRAPE_WAIT_SECONDS``: a count that takes longer (a backlog of millions of waiting jobs)
finishes after the answer and sets the gauges for the next scrape.
"""

from __future__ import annotations

import json
import time

import anyio
import asyncpg
import structlog
from anyio.abc import TaskGroup

from api_sender.jobs import STATES
from api_sender.query import Query

from .db import statements as db
from .metrics import QUEUE_JOBS, QUEUE_OLDEST_WAITING, QUEUE_PAUSED
from .queue.sql import render

log = structlog.get_logger("worker.metrics")

#: Scrapes closer together than this reuse the last counts (every replica answers scrapes).
MIN_REFRESH_SECONDS = 5.0
#: How long a scrape waits for a count in progress before answering with the previous values
#: (contract section 9: a scrape answers within 1 s).
SCRAPE_WAIT_SECONDS = 0.7
#: The count's own limit: values stay at most MIN_REFRESH_SECONDS + this old (within 15 s).
COUNT_TIMEOUT_SECONDS = 9.0

#: The count's transaction-local settings: its own statement timeout, and jit off (see the
#: statement).
_COUNT_SETTINGS = Query(
    "count_settings",
    "SELECT set_config('statement_timeout', :timeout_ms, true), set_config('jit', 'off', true)",
).render("public")


class QueueGauges:
    """Counts jobs per queue and state for ``queue_jobs`` and ``queue_oldest_waiting_seconds``.

    One count at a time per process; scrapes that arrive meanwhile wait for it (up to their
    budget) instead of starting another.
    """

    def __init__(self, schema: str, *, timeout: float = COUNT_TIMEOUT_SECONDS) -> None:
        self._sql = render(schema).counts
        self._timeout = timeout
        self._last = -float("inf")
        self._running: anyio.Event | None = None

    async def refresh(self, pool: asyncpg.Pool | None) -> None:
        """Count now unless counted within MIN_REFRESH_SECONDS (or counting); wait for it.

        A failing count logs and leaves the previous values.
        """
        if pool is None:
            return
        if self._running is not None:
            await self._running.wait()
            return
        if time.monotonic() - self._last < MIN_REFRESH_SECONDS:
            return
        self._last = time.monotonic()
        self._running = done = anyio.Event()
        try:
            rows = await self._count(pool)
        finally:
            self._running = None
            done.set()
        if rows is not None:
            _publish(rows)

    def start_refresh(self, pool: asyncpg.Pool | None, task_group: TaskGroup) -> anyio.Event:
        """Run :meth:`refresh` in ``task_group``; the event is set when it has finished."""
        finished = anyio.Event()

        async def refresh_then_signal() -> None:
            try:
                await self.refresh(pool)
            finally:
                finished.set()

        task_group.start_soon(refresh_then_signal)
        return finished

    async def _count(self, pool: asyncpg.Pool) -> list[asyncpg.Record] | None:
        try:
            with anyio.fail_after(self._timeout + 1.0):
                async with pool.acquire() as conn, conn.transaction(readonly=True):
                    # statement_timeout is in milliseconds; jit off: see the statement.
                    await db.execute(
                        conn, _COUNT_SETTINGS, timeout_ms=str(int(self._timeout * 1000))
                    )
                    rows: list[asyncpg.Record] = await db.fetch(conn, self._sql)
                    return rows
        except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError):
            return None
        except Exception as exc:
            log.warning("metrics.count_failed", error=f"{type(exc).__name__}: {exc}")
            return None


def _publish(rows: list[asyncpg.Record]) -> None:
    for row in rows:
        counts = json.loads(row["counts"])
        for state in STATES:
            QUEUE_JOBS.labels(row["name"], state).set(counts.get(state, 0))
        oldest = row["oldest_waiting_seconds"]
        QUEUE_OLDEST_WAITING.labels(row["name"]).set(float(oldest) if oldest else 0.0)
        QUEUE_PAUSED.labels(row["name"]).set(1 if row["paused"] else 0)
