"""idempotency-purge: idempotency_keys rows past their expires_at go, a batch at a time."""

from __future__ import annotations

import asyncpg

from . import sql
from .batches import BatchLimits, drain
from .runs import PurgeRun

IDEMPOTENCY_LIMITS = BatchLimits(batch_size=5000)


async def purge_idempotency_keys(
    conn: asyncpg.Connection, run: PurgeRun, limits: BatchLimits = IDEMPOTENCY_LIMITS
) -> None:
    """Delete the replay rows whose ``expires_at`` is before ``run.now``."""
    run.retention = "expires_at"
    await drain(conn, run, sql.DELETE_IDEMPOTENCY_BATCH, {"now": run.now}, limits)
