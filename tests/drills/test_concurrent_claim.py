"""Drill 8: many processes claiming one queue at once, with mixed priorities."""

from __future__ import annotations

import asyncio
import itertools
import random
import time

import asyncpg
import pytest

from api_sender import Sender
from tests.drills.helpers import SCALE, Fleet, create_ledger, fetch, runs, sized, states, wait_for
from tests.support.processes import run_cli

pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills")]

QUEUE = "drill-claim"
ENV = {"TOOL_JOBS": "tests.support.tooljobs:DRILL_WIDE", "USAGE_DOWNSTREAM": "noop"}
#: Handlers and claim size per process (DRILL_WIDE in tests/support/tooljobs.py).
WIDTH = 16
PRIORITIES = (10, 5, 0)


async def test_concurrent_claims_run_each_job_once_in_priority_order(
    db_url: str, fleet: Fleet, drill_report
):
    """Several processes of 16 handlers start at once on a queue of mixed-priority jobs: every
    job runs exactly once, and a lower priority starts only once the higher ones are taken
    (save for the claims racing at that moment)."""
    processes = sized(4, 8)
    jobs = sized(4000, 50_000)
    await create_ledger(db_url)
    migrated = await asyncio.to_thread(run_cli, db_url, "migrate", env=ENV)
    assert migrated.returncode == 0, migrated.stderr
    rng = random.Random(8)
    chunks = [rng.choice(PRIORITIES) for _ in range(jobs // 100)]
    conn = await asyncpg.connect(db_url)
    try:
        async with Sender.connect(db_url, max_size=1) as sender, conn.transaction():
            for n, priority in enumerate(chunks):
                await sender.send_many(
                    QUEUE,
                    [{"n": n * 100 + i} for i in range(100)],
                    priority=priority,
                    connection=conn,
                )
    finally:
        await conn.close()
    began = time.monotonic()
    await fleet.start_ready(db_url, ENV, count=processes)

    async def all_done() -> bool:
        return (await states(db_url, QUEUE))["completed"] == jobs

    await wait_for(all_done, sized(120, 900), "every job to complete", step=0.5)
    took = time.monotonic() - began
    ledger = await runs(db_url, QUEUE)
    assert len(ledger.done) == jobs
    assert set(ledger.done.values()) == {1}, "a job ran twice"
    assert set(ledger.started.values()) == {1}, "a job started twice"
    pids = await fetch(db_url, "SELECT count(DISTINCT pid) FROM public.drill_ledger")
    assert int(pids[0][0]) == processes
    rows = await fetch(
        db_url,
        "SELECT priority, extract(epoch FROM started_at) AS at FROM jobs.job WHERE queue = $1",
        QUEUE,
    )
    claimed: dict[int, list[float]] = {p: [] for p in PRIORITIES}
    for row in rows:
        claimed[row["priority"]].append(float(row["at"]))
    # Claims racing the last claim of a higher priority may take a few lower ones early.
    bound = processes * WIDTH
    worst = 0
    for high, low in itertools.pairwise(PRIORITIES):
        last_high = max(claimed[high])
        early = sum(1 for at in claimed[low] if at < last_high)
        worst = max(worst, early)
        assert early <= bound, f"{early} jobs of priority {low} started before {high} was done"
        assert sum(claimed[high]) / len(claimed[high]) < sum(claimed[low]) / len(claimed[low])
    drill_report(
        f"drill 8 concurrent claim [{SCALE}: {processes} processes x {WIDTH} handlers, {jobs}"
        f" jobs, priorities {'/'.join(map(str, PRIORITIES))}]: all done in {took:.1f}s"
        f" ({jobs / took:.0f} jobs/s), each exactly once; priority order held (at most {worst}"
        f" lower-priority jobs started during the last claims of a higher one, bound {bound});"
        " nothing lost"
    )
