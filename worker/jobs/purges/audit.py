"""audit-purge: audit_log rows older than AUDIT_RETENTION_DAYS go, a batch at a time."""

from __future__ import annotations

import asyncpg

from . import sql
from .batches import BatchLimits, drain
from .runs import PurgeBody, PurgeRun, span

AUDIT_LIMITS = BatchLimits(batch_size=5000)


async def purge_audit_log(
    conn: asyncpg.Connection,
    run: PurgeRun,
    retention_days: int,
    limits: BatchLimits = AUDIT_LIMITS,
) -> None:
    """Delete audit rows created before ``run.now - retention_days``; 0 days deletes nothing."""
    if retention_days <= 0:
        run.retention = "disabled"
        return
    run.retention = span(retention_days, "day")
    await drain(
        conn,
        run,
        sql.DELETE_AUDIT_BATCH,
        {"now": run.now, "retention_days": retention_days},
        limits,
    )


def audit_body(retention_days: int, limits: BatchLimits = AUDIT_LIMITS) -> PurgeBody:
    """The audit-purge body for one retention setting."""

    async def body(conn: asyncpg.Connection, run: PurgeRun) -> None:
        await purge_audit_log(conn, run, retention_days, limits)

    return body
