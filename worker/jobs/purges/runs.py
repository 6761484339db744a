"""One purge run: its clock, its tally, its ``purge.ran`` line, metric and run record."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg
import structlog

from ...db import statements as db
from ...db.bounded import HandlerPool
from ...metrics import PURGE_DELETED
from . import sql
from .exclusive import RUN_LOCK_WAIT_SECONDS, exclusive_run

log = structlog.get_logger("worker.purge")


@dataclass(slots=True)
class PurgeRun:
    """One pass of one purge: the instant it measures against and what it did so far."""

    queue: str
    #: The run's one clock, read from the database once at the start.
    now: datetime
    #: The retention this run applied, as logged (``"30 days"``, ``"expires_at"``, ``"disabled"``).
    retention: str | None = None
    deleted: int = 0
    #: False when the run stopped at its batch cap or time budget with rows still due.
    drained: bool = True
    #: Figures for the log line and the run record (no personal data).
    details: dict[str, Any] = field(default_factory=dict)

    def count(self, rows: int) -> None:
        """Add rows that a committed statement deleted (or retired) to the tally and the metric."""
        if rows > 0:
            self.deleted += rows
            PURGE_DELETED.labels(self.queue).inc(rows)


#: A purge's body: works through one connection, measuring against ``run.now``.
PurgeBody = Callable[[asyncpg.Connection, PurgeRun], Awaitable[None]]


async def run_purge(
    pool: HandlerPool,
    schema: str,
    queue: str,
    job_id: int | None,
    body: PurgeBody,
    *,
    session_url: str,
    lock_wait: float = RUN_LOCK_WAIT_SECONDS,
) -> PurgeRun:
    """Under the purge's run lock (a dedicated connection to ``session_url``), read the clock,
    run ``body`` on one connection, record the run and log ``purge.ran``.

    The lock comes first, so a run that waited for another measures against a clock read after
    that one finished, and its record never overlaps the other's.
    """
    async with exclusive_run(session_url, queue, wait=lock_wait):
        return await _run(pool, schema, queue, job_id, body)


async def _run(
    pool: HandlerPool, schema: str, queue: str, job_id: int | None, body: PurgeBody
) -> PurgeRun:
    started = time.perf_counter()
    async with pool.acquire() as conn:
        now: datetime = await db.fetchval(conn, sql.READ_CLOCK)
        run = PurgeRun(queue=queue, now=now)
        try:
            await body(conn, run)
        except Exception as exc:
            # Rows already deleted stay deleted (each batch committed); the job fails and retries.
            log.warning(
                "purge.failed",
                queue=queue,
                deleted=run.deleted,
                retention=run.retention,
                error=f"{type(exc).__name__}: {exc}",
            )
            raise
        await db.execute(
            conn,
            sql.record_run(schema),
            queue=queue,
            job_id=job_id,
            started_at=now,
            deleted=run.deleted,
            drained=run.drained,
            details=json.dumps({"retention": run.retention, **run.details}),
        )
    emit = log.info if run.drained else log.warning
    emit(
        "purge.ran",
        queue=queue,
        deleted=run.deleted,
        duration_seconds=round(time.perf_counter() - started, 3),
        retention=run.retention,
        clock=now.isoformat(),
        drained=run.drained,
        **run.details,
    )
    return run


def span(amount: int, unit: str) -> str:
    """A retention as logged: ``"1 hour"``, ``"30 days"``."""
    return f"{amount} {unit}" if amount == 1 else f"{amount} {unit}s"
