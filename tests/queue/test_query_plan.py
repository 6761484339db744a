"""The hot path keeps its indexes when the table is full of finished jobs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

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


def _nodes(node: dict[str, Any], *, within: bool = False) -> Iterator[dict[str, Any]]:
    """``node`` and every node below it; ``within``: only its own inputs (outer, inner,
    members), not the subplans and CTEs it merely carries."""
    yield node
    for child in node.get("Plans", []):
        if not within or child.get("Parent Relationship") in ("Outer", "Inner", "Member"):
            yield from _nodes(child, within=within)


async def test_batched_writes_join_no_unnested_array_on_a_generic_plan(
    pool, sender: Sender
) -> None:
    """A prepared completion runs on a generic plan after five executions, which takes the
    batch for a row or ten: a join with the unnested arrays is then a nested loop unnesting
    them again per job (quadratic in the batch). The completion, the failure and the hand-back
    match by position instead: no join reads a function scan (the arrays unnested), and the
    rows are read through an index."""
    await make_queue(pool, "q")
    await pool.execute(
        """INSERT INTO jobs.job (queue, state, retry_limit, retry_delay, retry_backoff,
                                 expire_seconds, completed_at)
           SELECT 'q', 'completed', 0, 0, false, 900, now() FROM generate_series(1, 50000)"""
    )
    await sender.send_many("q", [{} for _ in range(10)])
    await pool.execute("ANALYZE jobs.job")
    # Each parameter's type and value by name, listed in the rendered statement's own order.
    typed = {
        "ids": ("bigint[]", "'{1,2}'"),
        "attempts": ("int[]", "'{1,1}'"),
        "claims": ("bytea[]", "'{NULL,NULL}'"),
        "owner": ("uuid", "'00000000-0000-0000-0000-000000000000'"),
        "queue": ("text", "'q'"),
        "limit": ("int", "5"),
        "owners": ("uuid[]", "'{00000000-0000-0000-0000-000000000000,NULL}'"),
        "errors": ("text[]", "'{a,b}'"),
        "finals": ("bool[]", "'{false,true}'"),
        "lazy": ("bool", "true"),
    }
    for name, rendered in (
        ("complete", SQL.complete),
        ("complete_lost", SQL.complete_lost),
        ("complete_and_claim", SQL.complete_and_claim),
        ("fail", SQL.fail),
        ("hand_back", SQL.hand_back),
    ):
        statement = rendered.text
        types = ", ".join(typed[p][0] for p in rendered.parameters)
        args = ", ".join(typed[p][1] for p in rendered.parameters)
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            await conn.execute(f"PREPARE {name} ({types}) AS {statement}")
            [plan] = json.loads(
                await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE {name} ({args})")
            )
            await conn.execute(f"DEALLOCATE {name}")
            await conn.execute("ROLLBACK")
        nodes = list(_nodes(plan["Plan"]))
        assert not any(n["Node Type"] == "Seq Scan" for n in nodes), name
        for join in (n for n in nodes if "Join Type" in n):
            below = list(_nodes(join, within=True))
            assert not any(m["Node Type"] == "Function Scan" for m in below), name
