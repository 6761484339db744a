"""One-off timers: at an instant or after a delay, keyed replace, cancel."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from api_sender import InvalidJob, QueueNotFound, Sender, sql
from tests.support.queues import make_queue
from worker.queue.maintenance import Maintenance
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


async def _pending(pool, key: str) -> list[int]:
    """Ids of the timers of ``key`` that may still run (waiting or running)."""
    rows = await pool.fetch(
        "SELECT id FROM jobs.job WHERE singleton_key = $1 AND state IN ('created', 'retry',"
        " 'active') ORDER BY id",
        key,
    )
    return [r["id"] for r in rows]


@pytest.mark.parametrize("outcome", ["complete", "fail", "fail_for_good", "hand_back", "rescue"])
async def test_replace_of_a_running_timer_cancels_it_for_every_outcome(
    pool, sender: Sender, outcome: str
) -> None:
    """A replace while the old timer runs cancels it: its handler's late outcome (complete,
    fail, hand back, or a rescue of its silent worker) matches nothing, and only the new timer
    is left to run."""
    await make_queue(pool, "t-dead")
    # At its last attempt, the old timer's failure would also leave a dead-letter copy.
    options = {"retry_limit": 0, "dead_letter": "t-dead"} if outcome == "fail_for_good" else {}
    await make_queue(pool, "t", **options)
    old = await sender.timers.schedule("t", delay_seconds=0, key="k")
    store = JobStore(pool, SQL, uuid.uuid4())
    [running] = await store.claim("t", 1)
    assert running.id == old
    new = await sender.timers.schedule("t", delay_seconds=60, key="k")
    if outcome == "complete":
        assert await store.complete([running]) == set()
    elif outcome in ("fail", "fail_for_good"):
        assert await store.fail([(running, "boom")]) == []
    elif outcome == "hand_back":
        assert await store.hand_back([running]) == set()
    else:
        # The worker went silent long ago (it has no worker row at all): a rescue pass.
        await pool.execute(
            "UPDATE jobs.job SET started_at = now() - interval '1 hour' WHERE id = $1", old
        )
        maintenance = Maintenance(store, SQL, "jobs", interval=1, stale_seconds=5)
        assert await maintenance.run_once(prune=False) == (0, 0)
    states = dict(await pool.fetch("SELECT id, state::text FROM jobs.job"))
    assert states == {old: "cancelled", new: "created"}
    assert await _pending(pool, "k") == [new]


async def test_cancel_of_a_running_timer_cancels_it(pool, sender: Sender) -> None:
    """cancel() of a key whose timer is running cancels it (True); its late failure cannot
    put it back in retry, and a second cancel finds nothing."""
    await make_queue(pool, "t")
    old = await sender.timers.schedule("t", delay_seconds=0, key="k")
    store = JobStore(pool, SQL, uuid.uuid4())
    [running] = await store.claim("t", 1)
    assert await sender.timers.cancel("t", "k") is True
    assert await store.fail([(running, "boom")]) == []
    assert await pool.fetchval("SELECT state::text FROM jobs.job WHERE id = $1", old) == (
        "cancelled"
    )
    assert await sender.timers.cancel("t", "k") is False


async def test_cancel_reads_indexes_among_many_finished_timers(pool, sender: Sender) -> None:
    """With 50,000 finished timers present, a cancel (and so a replace) never scans the table."""
    await make_queue(pool, "t")
    await pool.execute(
        """INSERT INTO jobs.job (queue, state, retry_limit, retry_delay, retry_backoff,
                                 expire_seconds, completed_at, singleton_key, is_timer)
           SELECT 't', 'completed', 0, 0, false, 900, now(), 'k' || i, true
           FROM generate_series(1, 50000) i"""
    )
    await sender.timers.schedule("t", delay_seconds=60, key="k1")
    await pool.execute("ANALYZE jobs.job")
    cancel = sql.CANCEL_TIMER.render(sender.schema)
    plan = await pool.fetchval(
        "EXPLAIN (FORMAT JSON) " + cancel.text, *cancel.args({"queue": "t", "key": "k1"})
    )
    assert "Seq Scan" not in json.dumps(plan)
