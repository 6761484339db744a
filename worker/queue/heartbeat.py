"""The worker heartbeat: written only while this process holds jobs."""

from __future__ import annotations

import contextlib
import os
import socket
from uuid import UUID

import anyio
import asyncpg
import structlog

from ..db.connections import TRANSIENT_ERRORS
from .holdings import Holdings
from .sql import QueueStatements

log = structlog.get_logger("worker.heartbeat")


class Heartbeat:
    """Upserts this worker's row every ``interval`` seconds while it holds at least one job.

    A job is rescued only when its claim AND its worker's last beat are older than the stale
    limit, so an idle worker can stay silent (no writes) without its next claims being at risk.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        sql: QueueStatements,
        owner: UUID,
        holdings: Holdings,
        *,
        interval: float,
    ) -> None:
        self._pool = pool
        self._sql = sql
        self._owner = owner
        self._holdings = holdings
        self._interval = interval
        self._host = socket.gethostname()[:200]
        self._pid = os.getpid()

    async def beat(self) -> None:
        """Write one beat now."""
        await self._pool.execute(self._sql.heartbeat, self._owner, self._host, self._pid)

    async def beat_if_holding(self) -> None:
        """Beat now if this process holds jobs (an idle worker still writes nothing)."""
        if self._holdings.count:
            await self.beat()

    async def run(self) -> None:
        """Beat while jobs are held, until cancelled."""
        while True:
            await self._holdings.wait_nonzero()
            try:
                with anyio.fail_after(max(1.0, self._interval)):
                    await self.beat()
            except TRANSIENT_ERRORS as exc:
                log.warning(
                    "heartbeat.failed",
                    worker_id=str(self._owner),
                    error=f"{type(exc).__name__}: {exc}",
                )
            await anyio.sleep(self._interval)

    async def forget(self) -> None:
        """Remove this worker's row (clean stop)."""
        with contextlib.suppress(*TRANSIENT_ERRORS):
            await self._pool.execute(self._sql.forget_worker, self._owner)
