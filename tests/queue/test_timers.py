"""One-off timers: at an instant or after a delay, keyed replace, cancel."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from api_sender import InvalidJob, QueueNotFound, Sender
from tests.support.queues import make_queue
from worker.queue.sql import render
from worker.queue.store import JobStore

SQL = render("jobs")


async def test_timer_fires_at_its_instant_with_its_key(pool, sender: Sender) -> None:
    """A timer is not claimable before its instant; then it carries its data and key."""
    await make_queue(pool, "t")
    at = datetime.now(UTC) + timedelta(minutes=5)
    job_id = await sender.timers.schedule("t", at=at, data={"remind": 1}, key="k1")
    store = JobStore(pool, SQL, uuid.uuid4())
    assert await store.claim("t", 1) == []
    await pool.execute("UPDATE jobs.job SET start_after = now() WHERE id = $1", job_id)
    [job] = await store.claim("t", 1)
    assert (job.data, job.info().key) == ({"remind": 1}, "k1")


async def test_keyed_timer_replaces_the_pending_one(pool, sender: Sender) -> None:
    """Scheduling a key again cancels the pending timer of that key; other keys are untouched."""
    await make_queue(pool, "t")
    old = await sender.timers.schedule("t", delay_seconds=60, key="k")
    other = await sender.timers.schedule("t", delay_seconds=60, key="other")
    new = await sender.timers.schedule("t", delay_seconds=120, key="k")
    states = dict(await pool.fetch("SELECT id, state::text FROM jobs.job"))
    assert states == {old: "cancelled", other: "created", new: "created"}


async def test_twenty_concurrent_replaces_leave_one_pending(pool, sender: Sender) -> None:
    """20 concurrent schedules of one key leave exactly one pending timer."""
    await make_queue(pool, "t")
    await asyncio.gather(
        *(
            sender.timers.schedule("t", delay_seconds=30 + i, key="k", data={"i": i})
            for i in range(20)
        )
    )
    pending = await pool.fetchval(
        "SELECT count(*) FROM jobs.job WHERE singleton_key = 'k' AND state = 'created'"
    )
    assert pending == 1
    assert await pool.fetchval("SELECT count(*) FROM jobs.job") == 20


async def test_replace_inside_the_callers_transaction(pool, sender: Sender) -> None:
    """With connection=, a replace rolled back by the caller leaves the old timer pending."""
    await make_queue(pool, "t")
    old = await sender.timers.schedule("t", delay_seconds=60, key="k")
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await sender.timers.schedule("t", delay_seconds=60, key="k", connection=conn)
        await tx.rollback()
    rows = await pool.fetch("SELECT id, state::text FROM jobs.job")
    assert [(r["id"], r["state"]) for r in rows] == [(old, "created")]


async def test_cancel_reports_whether_a_timer_was_pending(pool, sender: Sender) -> None:
    """cancel() is True once for a pending timer and False when none is pending."""
    await make_queue(pool, "t")
    await sender.timers.schedule("t", delay_seconds=60, key="k")
    assert await sender.timers.cancel("t", "k") is True
    assert await sender.timers.cancel("t", "k") is False
    assert await sender.timers.cancel("t", "never") is False


async def test_timer_input_errors(pool, sender: Sender) -> None:
    """Exactly one of at/delay_seconds; a naive datetime and an unknown queue are refused."""
    await make_queue(pool, "t")
    with pytest.raises(InvalidJob):
        await sender.timers.schedule("t")
    with pytest.raises(InvalidJob):
        await sender.timers.schedule("t", at=datetime.now(UTC), delay_seconds=1)
    with pytest.raises(InvalidJob, match="timezone"):
        await sender.timers.schedule("t", at=datetime(2030, 1, 1))
    with pytest.raises(QueueNotFound):
        await sender.timers.schedule("nope", delay_seconds=1, key="k")
    assert await pool.fetchval("SELECT count(*) FROM jobs.job") == 0
