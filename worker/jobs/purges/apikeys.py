"""apikey-expiry-sweep: expired, unrevoked API keys get ``revoked_at = expires_at``."""

from __future__ import annotations

import asyncpg

from ...db import statements as db
from . import sql
from .batches import affected, capped
from .runs import PurgeRun

#: Client-side cap on the one UPDATE (see :class:`BatchLimits`).
STATEMENT_TIMEOUT_SECONDS = 30.0


async def retire_expired_api_keys(conn: asyncpg.Connection, run: PurgeRun) -> None:
    """Mark every key whose ``expires_at`` is before ``run.now`` and not yet revoked as revoked."""
    run.retention = "expires_at"
    cap = STATEMENT_TIMEOUT_SECONDS
    with capped(cap, "the api key sweep"):
        status = await db.execute(conn, sql.RETIRE_EXPIRED_API_KEYS, now=run.now, timeout=cap)
    run.count(affected(status))
