"""What the admin surfaces read: the queues document and the last hour's throughput."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from api_sender._schema import quoted
from api_sender.jobs import STATES

from ...queue.sql import render

_PAUSED = "SELECT name FROM {s}.queue WHERE paused"

_THROUGHPUT = """
-- console chart: jobs completed and failed per minute over the last hour, through the
-- job_finished index (completed_at) range of the last hour.
SELECT date_trunc('minute', j.completed_at) AS minute,
       count(*) FILTER (WHERE j.state = 'completed') AS completed,
       count(*) FILTER (WHERE j.state = 'failed') AS failed,
       date_trunc('minute', now()) AS now_minute
FROM {s}.job j
WHERE j.state > 'active' AND j.completed_at >= date_trunc('minute', now()) - interval '59 minutes'
GROUP BY 1
"""


async def queues_document(pool: asyncpg.Pool, schema: str) -> list[dict[str, Any]]:
    """One entry per queue, as ``queues --json`` prints it, with ``paused``."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(render(schema).counts)
        paused = {r["name"] for r in await conn.fetch(_PAUSED.format(s=quoted(schema)))}
    out = []
    for row in rows:
        counts = json.loads(row["counts"])
        oldest = row["oldest_waiting_seconds"]
        out.append(
            {
                "name": row["name"],
                "counts": {state: int(counts.get(state, 0)) for state in STATES},
                "oldest_waiting_seconds": float(oldest) if oldest is not None else None,
                "paused": row["name"] in paused,
                "policy": row["policy"],
                "dead_letter": row["dead_letter"],
                "cron": row["cron"],
            }
        )
    return out


@dataclass(frozen=True, slots=True)
class Minute:
    """Jobs finished in one minute."""

    start: datetime
    completed: int
    failed: int


async def throughput(pool: asyncpg.Pool, schema: str) -> list[Minute]:
    """The last 60 minutes, oldest first, every minute present (zeros where nothing finished)."""
    from datetime import timedelta

    rows = await pool.fetch(_THROUGHPUT.format(s=quoted(schema)))
    now_minute = rows[0]["now_minute"] if rows else None
    if now_minute is None:
        now_minute = await pool.fetchval("SELECT date_trunc('minute', now())")
    by_minute = {row["minute"]: row for row in rows}
    out = []
    for back in range(59, -1, -1):
        start = now_minute - timedelta(minutes=back)
        row = by_minute.get(start)
        out.append(
            Minute(start, int(row["completed"]) if row else 0, int(row["failed"]) if row else 0)
        )
    return out
