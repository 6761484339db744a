"""Reading the execution ledger tool jobs write."""

from __future__ import annotations

import asyncpg

from tests.support.tooljobs import LEDGER_DDL


async def create_ledger(url: str) -> None:
    """Create public.ledger in the database at ``url``."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(LEDGER_DDL)
    finally:
        await conn.close()


async def done_counts(url: str, queue: str) -> dict[int, int]:
    """job id -> how many runs of it finished."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT job_id, count(*) AS n FROM public.ledger WHERE queue = $1 AND phase = 'done'"
            " GROUP BY job_id",
            queue,
        )
    finally:
        await conn.close()
    return {r["job_id"]: r["n"] for r in rows}
