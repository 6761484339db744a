"""Queue counts three ways: what the job table holds (the ground truth), what the counters of
migration 0005 sum to, and what the ``counts`` statement reports; plus a bulk fill of finished
jobs for tests that need many."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from worker.db import statements
from worker.queue.sql import render

FINISHED = ("completed", "cancelled", "failed")

Counts = dict[tuple[str, str], int]


async def table_counts(db: Any, schema: str = "jobs") -> Counts:
    """``SELECT queue, state, count(*) ... GROUP BY``: jobs per (queue, state) of known queues."""
    rows = await db.fetch(
        f"SELECT j.queue, j.state::text AS state, count(*) AS n FROM {schema}.job j"
        f" WHERE j.queue IN (SELECT name FROM {schema}.queue) GROUP BY 1, 2"
    )
    return {(r["queue"], r["state"]): int(r["n"]) for r in rows}


async def finished_table_counts(db: Any, schema: str = "jobs") -> Counts:
    """The ground truth restricted to the finished states (all queues, known or not)."""
    rows = await db.fetch(
        f"SELECT queue, state::text AS state, count(*) AS n FROM {schema}.job"
        " WHERE state > 'active' GROUP BY 1, 2"
    )
    return {(r["queue"], r["state"]): int(r["n"]) for r in rows}


async def counter_sums(db: Any, schema: str = "jobs") -> Counts:
    """What the job_count rows add up to, per (queue, state), zero sums left out."""
    rows = await db.fetch(
        f"SELECT queue, state::text AS state, sum(n) AS n FROM {schema}.job_count"
        " GROUP BY 1, 2 HAVING sum(n) <> 0"
    )
    return {(r["queue"], r["state"]): int(r["n"]) for r in rows}


async def reported_counts(db: Any, schema: str = "jobs") -> Counts:
    """What the ``counts`` statement (gauges and ``chassis-worker queues``) reports, zeros left
    out, so it compares equal to :func:`table_counts`."""
    async with _connection(db) as conn, conn.transaction(readonly=True):
        await conn.execute("SET LOCAL jit = off")
        rows = await statements.fetch(conn, render(schema).counts)
    out: Counts = {}
    for row in rows:
        for state, n in json.loads(row["counts"]).items():
            if n:
                out[(row["name"], state)] = int(n)
    return out


@asynccontextmanager
async def _connection(db: Any) -> AsyncIterator[asyncpg.Connection]:
    """A connection from a pool (acquired, then released), or the connection itself."""
    if isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn:
            yield conn
    else:
        yield db


async def add_finished_jobs(
    db: Any, queue: str, n: int, *, state: str = "completed", schema: str = "jobs"
) -> None:
    """Insert ``n`` finished jobs in one statement with the per-row counting trigger off (as a
    bulk restore would), then recount the counters exactly, as migration 0005 does on a database
    that already holds jobs. On a schema without the counters (before 0005) only inserts."""
    async with _connection(db) as conn:
        reset = f"{schema}.job_count_reset"
        counted = await conn.fetchval("SELECT to_regproc($1) IS NOT NULL", reset)
        async with conn.transaction():
            if counted:  # transactional: no other session ever sees the trigger off
                await conn.execute(f"ALTER TABLE {schema}.job DISABLE TRIGGER job_count_insert")
            await conn.execute(
                f"""INSERT INTO {schema}.job (queue, state, data, retry_limit, retry_delay,
                        retry_backoff, expire_seconds, started_at, completed_at, attempt)
                    SELECT $1, $2::{schema}.job_state, jsonb_build_object('n', g), 0, 0, false,
                           900, now(), now(), 1
                    FROM generate_series(1, $3) g""",
                queue,
                state,
                n,
            )
            if counted:
                await conn.execute(f"ALTER TABLE {schema}.job ENABLE TRIGGER job_count_insert")
        if counted:
            await conn.fetchval(f"SELECT {schema}.job_count_reset()")
