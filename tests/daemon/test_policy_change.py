"""A redeploy that loosens a queue's policy: the new worker drains what waited under the old."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from api_sender import Sender
from tests.daemon.test_work import count, wait_for
from tests.support.ledger import create_ledger, done_counts
from tests.support.processes import start_daemon
from tests.support.queues import make_queue
from worker.queue.heartbeat import Heartbeat
from worker.queue.holdings import Holdings
from worker.queue.sql import render
from worker.queue.store import JobStore

pytestmark = [pytest.mark.slow]


async def test_singleton_to_standard_drains_every_waiting_job(db_url: str, tmp_path) -> None:
    """A singleton queue with keyed jobs waiting and one running is re-installed as standard:
    a real worker runs every waiting job once and stays up."""
    await create_ledger(db_url)
    pool = await asyncpg.create_pool(db_url, min_size=1, max_size=2)
    try:
        await make_queue(pool, "tool-policy", policy="singleton")
        sender = Sender(pool)
        ids = await sender.send_many(
            "tool-policy",
            [{"n": n} for n in range(60)],
            singleton_keys=[f"k{n % 3}" for n in range(60)],
        )
        # One job of key k0 runs all along on a live replica of the old deployment (it beats,
        # so it is never rescued).
        owner, holdings = uuid.uuid4(), Holdings()
        old = JobStore(pool, render("jobs"), owner)
        [running] = await old.claim("tool-policy", 1, one_per_key=True)
        holdings.add(1)
        beating = asyncio.create_task(
            Heartbeat(pool, render("jobs"), owner, holdings, interval=1).run()
        )
        daemon = start_daemon(
            db_url,
            tmp_path,
            env={"TOOL_JOBS": "tests.support.tooljobs:POLICY", "TEST_TOOL_POLICY": "standard"},
        )
        try:
            await asyncio.to_thread(daemon.wait_ready, 60)

            async def drained() -> bool:
                waiting = "SELECT count(*) FROM jobs.job WHERE state < 'active'"
                return (
                    await count(db_url, waiting) == 0
                    and len(await done_counts(db_url, "tool-policy")) == len(ids) - 1
                )

            await wait_for(drained, 60)
            done = await done_counts(db_url, "tool-policy")
            assert set(done) == set(ids) - {running.id}
            assert set(done.values()) == {1}
            assert daemon.process.poll() is None, daemon.logs()
            assert await old.complete([running]) == {running.id}
        finally:
            beating.cancel()
            assert daemon.stop() == 0, daemon.logs()
    finally:
        await pool.close()
