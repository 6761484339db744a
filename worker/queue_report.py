"""The queues document: per queue, jobs per state, the oldest waiting job, paused, schedule and
last purge run, as ``queues --json``, ``/v1/admin/queues`` and the console show it."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from api_sender.jobs import STATES

from .db import statements as db
from .jobs.purges import sql as purge_sql
from .queue.sql import render


async def queue_report(conn: asyncpg.Connection, schema: str) -> list[dict[str, Any]]:
    """One entry per queue: counts per state, the oldest waiting job's age, paused, the last
    purge run (the counts statement stays cheap at any table size: see COUNTS)."""
    async with conn.transaction(readonly=True):
        # jit off: see the statement.
        await conn.execute("SET LOCAL jit = off")
        rows = await db.fetch(conn, render(schema).counts)
    purges: dict[str, Any] = {}
    if await db.fetchval(conn, purge_sql.HAS_RUN_TABLE, table=purge_sql.run_table(schema)):
        purges = {r["queue"]: r for r in await db.fetch(conn, purge_sql.last_runs(schema))}
    report = []
    for row in rows:
        counts = json.loads(row["counts"])
        oldest = row["oldest_waiting_seconds"]
        report.append(
            {
                "name": row["name"],
                "counts": {state: int(counts.get(state, 0)) for state in STATES},
                "oldest_waiting_seconds": float(oldest) if oldest is not None else None,
                "paused": bool(row["paused"]),
                "policy": row["policy"],
                "dead_letter": row["dead_letter"],
                "cron": row["cron"],
                "last_run": row["last_run"].isoformat() if row["last_run"] else None,
                "last_purge": _last_purge(purges.get(row["name"])),
            }
        )
    return report


def _last_purge(row: Any) -> dict[str, Any] | None:
    if row is None:
        return None
    return {
        "started_at": row["started_at"].isoformat(),
        "finished_at": row["finished_at"].isoformat(),
        "deleted": int(row["deleted"]),
        "drained": bool(row["drained"]),
    }
