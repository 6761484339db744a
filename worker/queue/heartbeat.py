"""The worker heartbeat: written only while this process holds jobs."""

from __future__ import annotations

import contextlib
import os
import socket
from uuid import UUID

import anyio
import asyncpg
import structlog

from ..db import statements as db
from ..db.connections import RETRYABLE_ERRORS, TRANSIENT_ERRORS, backoff_delay
from .availability import Availability
from .holdings import Holdings
from .sql import QueueStatements

log = structlog.get_logger("worker.heartbeat")


class Heartbeat:
    """Upserts this worker's row every ``interval`` seconds while it holds at least one job.

    A job is rescued only when its claim AND its worker's last beat are older than the stale
    limit, so an idle worker can stay silent (no writes) without its next claims being at risk.
    A beat that fails is tried again soon (backoff from 0.1 s up to the interval), and at once
    when the database answers again after a loss: other replicas judge this one by its beat.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        sql: QueueStatements,
        owner: UUID,
        holdings: Holdings,
        *,
        interval: float,
        availability: Availability | None = None,
    ) -> None:
        self._availability = availability or Availability()
        self._pool = pool
        self._sql = sql
        self._owner = owner
        self._holdings = holdings
        self._interval = interval
        self._host = socket.gethostname()[:200]
        self._pid = os.getpid()

    async def beat(self) -> None:
        """Write one beat now."""
        await db.execute(
            self._pool, self._sql.heartbeat, owner=self._owner, host=self._host, pid=self._pid
        )
        self._availability.answered()

    async def beat_if_holding(self) -> None:
        """Beat now if this process holds jobs (an idle worker still writes nothing)."""
        if self._holdings.count:
            await self.beat()

    async def run(self) -> None:
        """Beat while jobs are held, until cancelled."""
        failures = 0
        while True:
            await self._holdings.wait_nonzero()
            try:
                with anyio.fail_after(max(1.0, self._interval)):
                    await self.beat()
                failures = 0
                delay = self._interval
            except RETRYABLE_ERRORS as exc:
                if isinstance(exc, TRANSIENT_ERRORS):
                    self._availability.lost()
                delay = backoff_delay(failures, base=0.2, cap=self._interval)
                failures += 1
                log.warning(
                    "heartbeat.failed",
                    worker_id=str(self._owner),
                    error=f"{type(exc).__name__}: {exc}",
                    retry_in=round(delay, 2),
                )
            with anyio.move_on_after(delay):
                await self._availability.wait_back()

    async def forget(self) -> None:
        """Remove this worker's row (clean stop)."""
        with contextlib.suppress(*RETRYABLE_ERRORS):
            await db.execute(self._pool, self._sql.forget_worker, owner=self._owner)
