"""What the admin surfaces read: the queues document and the last hour's throughput."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from api_sender.query import Query

from ...db import statements as db
from ...queue.throughput import LAST_HOUR, tally
from ...queue_report import queue_report

#: Every queue by name, for the console's filter form.
_QUEUE_NAMES = Query("queue_names", "SELECT name FROM {s}.queue ORDER BY name")
#: The size of jobs' data, as a redacted job shows it (section 10: ``octet_length(data::text)``).
_DATA_BYTES = Query(
    "data_bytes",
    "SELECT id, octet_length(data::text) AS bytes FROM {s}.job WHERE id = ANY(:ids::bigint[])",
)


async def queues_document(pool: asyncpg.Pool, schema: str) -> list[dict[str, Any]]:
    """One entry per queue, the ``queues --json`` document."""
    async with pool.acquire() as conn:
        return await queue_report(conn, schema)


async def queue_names(pool: asyncpg.Pool, schema: str) -> list[str]:
    """Every installed queue's name, for the filter form (no counting)."""
    rows = await db.fetch(pool, _QUEUE_NAMES.render(schema))
    return [row["name"] for row in rows]


async def data_sizes(pool: asyncpg.Pool, schema: str, job_ids: list[int]) -> dict[int, int]:
    """The size in bytes of each of these jobs' data, by job id (a job gone meanwhile: absent)."""
    if not job_ids:
        return {}
    rows = await db.fetch(pool, _DATA_BYTES.render(schema), ids=job_ids)
    return {row["id"]: row["bytes"] for row in rows}


@dataclass(frozen=True, slots=True)
class Minute:
    """Jobs finished in one minute."""

    start: datetime
    completed: int
    failed: int


#: When the newest tallied minute began longer ago than this (seconds), the console brings the
#: tally up to date itself (no worker finished jobs lately, or none runs): cheap, since only the
#: rows finished since that minute are counted.
STALE_TALLY_SECONDS = 120.0


async def throughput(pool: asyncpg.Pool, schema: str) -> list[Minute]:
    """The last 60 minutes, oldest first, every minute present (zeros where nothing finished),
    from the per-minute tally (worker/queue/throughput.py)."""
    last_hour = LAST_HOUR.render(schema)
    async with pool.acquire() as conn:
        rows = await db.fetch(conn, last_hour)
        age = rows[-1]["newest_age"] if rows else None
        stale = age is None or age.total_seconds() > STALE_TALLY_SECONDS
        if stale and await tally(conn, schema, forget=False):
            rows = await db.fetch(conn, last_hour)
        now_minute = rows[0]["now_minute"] if rows else None
        if now_minute is None:
            now_minute = await conn.fetchval("SELECT date_trunc('minute', now())")
    by_minute = {row["minute"]: row for row in rows}

    out = []
    for back in range(59, -1, -1):
        start = now_minute - timedelta(minutes=back)
        row = by_minute.get(start)
        out.append(
            Minute(start, int(row["completed"]) if row else 0, int(row["failed"]) if row else 0)
        )
    return out
