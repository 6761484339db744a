"""Drill 14: a steady stream of jobs for a while; the job table must stop growing."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import asyncpg
import pytest

from tests.drills.helpers import SCALE, Fleet, Load, create_ledger, runs, sized, wait_for
from worker.queue.sql import render

#: At most two daemons: runs in the second drill lane, beside the multi-process drills.
pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills-light")]

QUEUE = "drill-soak"
RETENTION = 2
ENV = {
    "TOOL_JOBS": "tests.support.tooljobs:DRILL_SOAK",
    "DRILL_RETENTION_SECONDS": str(RETENTION),
}
SIZES = """
SELECT pg_relation_size('jobs.job') AS heap, pg_indexes_size('jobs.job') AS indexes,
       (SELECT count(*) FROM jobs.job) AS live
"""


async def candidate_scans(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """The plan nodes of the claim statement that look for due jobs of the queue (EXPLAIN
    writes nothing).

    At small scale the table is a dozen pages, where the planner rightly picks whatever scan is
    cheapest (a sequential or bitmap scan of a few pages), so there the check is that the claim
    can still use job_fetch (sequential and bitmap scans off); at full scale, with millions of
    rows sent, that the planner prefers it.
    """
    async with conn.transaction():
        if SCALE == "small":
            await conn.execute("SET LOCAL enable_seqscan = off")
            await conn.execute("SET LOCAL enable_bitmapscan = off")
        claim = render("jobs").claim
        plan = await conn.fetchval(
            "EXPLAIN (FORMAT JSON) " + claim.text,
            *claim.args(
                {"queue": QUEUE, "limit": 16, "owner": "00000000-0000-0000-0000-000000000000"}
            ),
        )
    found: list[dict[str, Any]] = []

    def walk(node: dict[str, Any]) -> None:
        conditions = f"{node.get('Index Cond', '')} {node.get('Filter', '')}"
        if node.get("Relation Name") == "job" and "queue" in conditions:
            found.append(node)
        for child in node.get("Plans", []):
            walk(child)

    walk((json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"])
    return found


async def test_table_and_indexes_plateau_under_a_steady_stream(
    db_url: str, fleet: Fleet, drill_report
):
    """Jobs sent at a steady rate with a 2 s retention: the table and its indexes stop growing
    once pruning and vacuum keep pace, the claim query keeps its partial index, and every job
    ran."""
    rate = sized(100, 500)
    duration = sized(20.0, 300.0)
    await create_ledger(db_url)
    await fleet.start_ready(db_url, ENV, count=2)
    samples: list[tuple[float, int, int, int]] = []
    conn = await asyncpg.connect(db_url)
    try:
        async with Load(db_url, QUEUE, lambda _: {}, batch=rate // 5, every=0.2) as load:
            began = time.monotonic()
            while time.monotonic() - began < duration:
                await asyncio.sleep(sized(2.0, 10.0))
                # Autovacuum is off on the test server: vacuum as it would, on a timer.
                await conn.execute("VACUUM (ANALYZE) jobs.job")
                row = await conn.fetchrow(SIZES)
                samples.append((time.monotonic() - began, row["heap"], row["indexes"], row["live"]))
            scans = await candidate_scans(conn)
        ids = load.ids

        async def all_ran() -> bool:
            return not (await runs(db_url, QUEUE)).missing(ids)

        await wait_for(all_ran, 60, "every job to run")
    finally:
        await conn.close()
    assert scans, "no scan for due jobs in the claim plan"
    assert {(n["Node Type"], n.get("Index Name")) for n in scans} <= {
        ("Index Scan", "job_fetch"),
        ("Index Only Scan", "job_fetch"),
        ("Bitmap Index Scan", "job_fetch"),
    }, scans
    half = [s for s in samples if s[0] >= duration / 2]
    mid, end = half[0], samples[-1]
    slack = 64 * 1024
    peak_heap = max(s[1] for s in samples)
    peak_index = max(s[2] for s in samples)
    assert end[1] <= mid[1] * 1.25 + slack, f"heap still growing: {samples}"
    assert end[2] <= mid[2] * 1.25 + slack, f"indexes still growing: {samples}"
    assert max(s[3] for s in half) < rate * (RETENTION + 10), "finished jobs are not pruned"
    drill_report(
        f"drill 14 bloat soak [{SCALE}: {len(ids)} jobs at {rate}/s for {duration:g}s, retention"
        f" {RETENTION}s, VACUUM every few s as autovacuum would (it is off on the test server)]:"
        f" heap {mid[1] // 1024} kB at half time -> {end[1] // 1024} kB at the end (peak"
        f" {peak_heap // 1024} kB), indexes {mid[2] // 1024} -> {end[2] // 1024} kB (peak"
        f" {peak_index // 1024} kB), live rows <= {max(s[3] for s in samples)}; the claim"
        f" still finds due jobs through job_fetch; nothing lost ({len(ids)}/{len(ids)} ran)"
    )
