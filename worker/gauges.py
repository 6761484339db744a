"""The per-queue gauges (jobs per state, oldest waiting job), refreshed at scrape time."""

from __future__ import annotations

import json
import time

import anyio
import asyncpg
import structlog

from .metrics import QUEUE_JOBS, QUEUE_OLDEST_WAITING, QUEUE_PAUSED
from .queue.sql import render

log = structlog.get_logger("worker.metrics")

STATES = ("created", "retry", "active", "completed", "cancelled", "failed")
#: Scrapes closer together than this reuse the last counts (every replica answers scrapes).
MIN_REFRESH_SECONDS = 5.0


class QueueGauges:
    """Counts jobs per queue and state for ``queue_jobs`` and ``queue_oldest_waiting_seconds``."""

    def __init__(self, schema: str) -> None:
        self._sql = render(schema).counts
        self._last = -float("inf")
        self._lock = anyio.Lock()

    async def refresh(self, pool: asyncpg.Pool | None) -> None:
        """Re-count unless counted recently; a slow or failing count leaves the old values."""
        if pool is None:
            return
        async with self._lock:
            if time.monotonic() - self._last < MIN_REFRESH_SECONDS:
                return
            self._last = time.monotonic()
            try:
                with anyio.fail_after(3.0):
                    async with pool.acquire() as conn, conn.transaction(readonly=True):
                        await conn.execute("SET LOCAL statement_timeout = 2500")
                        rows = await conn.fetch(self._sql)
            except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError):
                return
            except Exception as exc:
                log.warning("metrics.count_failed", error=f"{type(exc).__name__}: {exc}")
                return
        for row in rows:
            counts = json.loads(row["counts"])
            for state in STATES:
                QUEUE_JOBS.labels(row["name"], state).set(counts.get(state, 0))
            oldest = row["oldest_waiting_seconds"]
            QUEUE_OLDEST_WAITING.labels(row["name"]).set(float(oldest) if oldest else 0.0)
            QUEUE_PAUSED.labels(row["name"]).set(1 if row["paused"] else 0)
