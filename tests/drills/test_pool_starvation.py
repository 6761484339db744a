"""Drill 15: 32 handlers at once borrowing connections from a daemon pool of 4."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from api_sender import Sender
from tests.drills.helpers import (
    SCALE,
    Fleet,
    create_ledger,
    log_events,
    runs,
    sized,
    states,
)

#: At most two daemons: runs in the second drill lane, beside the multi-process drills.
pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills-light")]

QUEUE = "drill-starve"
ENV = {"TOOL_JOBS": "tests.support.tooljobs:DRILL_STARVE", "DATABASE_POOL_SIZE": "4"}
HEARTBEAT = 1.0


async def test_handlers_borrowing_a_small_pool_neither_deadlock_nor_starve_the_heartbeat(
    db_url: str, fleet: Fleet, drill_report
):
    """A worker with a pool of 4 runs 32 handlers that each borrow one of its connections: the
    narrower pool is warned about at boot, every job completes, no job is rescued or loses its
    claim, and the heartbeat never falls behind."""
    jobs = sized(300, 3000)
    await create_ledger(db_url)
    [daemon] = await fleet.start_ready(db_url, ENV)
    warnings = log_events(daemon, "pool.narrower_than_concurrency")
    assert warnings, "no warning that 32 handlers cannot all hold a connection"
    async with Sender.connect(db_url, max_size=1) as sender:
        ids = set(await sender.send_many(QUEUE, [{"sleep": 0.3, "borrow": 0.05}] * jobs))
    began = time.monotonic()
    worst_beat = 0.0
    beats_seen = 0
    conn = await asyncpg.connect(db_url)
    try:
        while (await states(db_url, QUEUE))["completed"] < jobs:
            assert time.monotonic() - began < sized(60, 300), "the queue stalled: deadlock?"
            age = await conn.fetchval(
                "SELECT extract(epoch FROM now() - max(heartbeat_at)) FROM jobs.worker"
            )
            if age is not None:
                beats_seen += 1
                worst_beat = max(worst_beat, float(age))
            await asyncio.sleep(0.25)
        rescued = await conn.fetchval(
            "SELECT count(*) FROM jobs.job WHERE output->>'error' LIKE 'rescued%'"
        )
    finally:
        await conn.close()
    took = time.monotonic() - began
    assert beats_seen > 0, "the worker never beat while holding jobs"
    assert worst_beat < 2 * HEARTBEAT + 0.5, f"the heartbeat fell {worst_beat:.1f}s behind"
    assert rescued == 0
    assert not log_events(daemon, "job.lease_lost")
    ledger = await runs(db_url, QUEUE)
    assert ledger.missing(ids) == set()
    assert set(ledger.done.values()) == {1}
    limit = warnings[0]["handler_connections"]
    drill_report(
        f"drill 15 pool starvation [{SCALE}: pool 4, 32 handlers, {jobs} jobs each borrowing a"
        f" daemon connection]: pool.narrower_than_concurrency warned ({limit} handler"
        f" connections), all done in {took:.1f}s without deadlock, heartbeat never older than"
        f" {worst_beat:.1f}s (beat {HEARTBEAT:g}s), 0 rescued, 0 lease lost; nothing lost"
        f" ({jobs}/{jobs} completed once)"
    )
