"""End to end through the store: send, claim, complete, fail."""

import uuid

from api_sender import Sender
from tests.support.queues import make_queue
from worker.queue.sql import render
from worker.queue.store import JobStore


async def test_send_claim_complete(pool, sender: Sender) -> None:
    """A sent job is claimed once and completes."""
    await make_queue(pool, "q")
    job_id = await sender.send("q", {"a": 1})
    store = JobStore(pool, render("jobs"), uuid.uuid4())
    jobs = await store.claim("q", 10)
    assert [j.id for j in jobs] == [job_id]
    assert jobs[0].data == {"a": 1}
    assert await store.claim("q", 10) == []
    assert await store.complete(jobs) == {job_id}
    state = await pool.fetchval("SELECT state::text FROM jobs.job WHERE id = $1", job_id)
    assert state == "completed"
