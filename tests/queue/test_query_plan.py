"""The hot path keeps its indexes when the table is full of finished jobs."""

from __future__ import annotations

import json

from api_sender import Sender
from tests.support.queues import make_queue
from worker.queue.sql import render

SQL = render("jobs")


async def test_claim_uses_the_fetch_index_among_many_finished_rows(pool, sender: Sender) -> None:
    """With 50,000 completed rows present, the claim reads the partial fetch index."""
    await make_queue(pool, "q")
    await pool.execute(
        """INSERT INTO jobs.job (queue, state, retry_limit, retry_delay, retry_backoff,
                                 expire_seconds, completed_at)
           SELECT 'q', 'completed', 0, 0, false, 900, now() FROM generate_series(1, 50000)"""
    )
    await sender.send_many("q", [{} for _ in range(10)])
    await pool.execute("ANALYZE jobs.job")
    async with pool.acquire() as conn, conn.transaction():
        plan = await conn.fetchval(
            "EXPLAIN (FORMAT JSON) " + SQL.claim.text,
            *SQL.claim.args(
                {"queue": "q", "limit": 5, "owner": "00000000-0000-0000-0000-000000000000"}
            ),
        )
        await conn.execute("ROLLBACK")  # EXPLAIN without ANALYZE writes nothing; be explicit
    text = json.dumps(plan)
    assert "job_fetch" in text
    assert "Seq Scan" not in text


async def test_probe_uses_indexes(pool, sender: Sender) -> None:
    """The idle probe reads indexes only, whatever the table holds."""
    await make_queue(pool, "q")
    await pool.execute(
        """INSERT INTO jobs.job (queue, state, retry_limit, retry_delay, retry_backoff,
                                 expire_seconds, completed_at)
           SELECT 'q', 'completed', 0, 0, false, 900, now() FROM generate_series(1, 50000)"""
    )
    await sender.send_many("q", [{} for _ in range(10)], start_after=600)
    await pool.execute("ANALYZE jobs.job")
    plan = await pool.fetchval(
        "EXPLAIN (FORMAT JSON) " + SQL.probe.text,
        *SQL.probe.args({"queues": ["q"], "stale_seconds": 30.0, "min_retention": 3600.0}),
    )
    assert "Seq Scan on job" not in json.dumps(plan)
