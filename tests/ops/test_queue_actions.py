"""Queue management through ``sender.queues``: pause, resume, purge, and their audit rows."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from api_sender import QueueNotFound, Sender
from tests.support.queues import make_queue
from worker.db import statements as db
from worker.queue.sql import render
from worker.queue.store import JobStore

SQL = render("jobs")


async def test_a_paused_queue_accepts_sends_and_starts_nothing(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """From the pause's commit no claim returns a job of the queue (plain or one-per-key), the
    probe reports it as not due, and sends still land; resume makes them claimable again."""
    await make_queue(pool, "q")
    await make_queue(pool, "solo", policy="singleton")
    store = JobStore(pool, SQL, uuid.uuid4())
    assert await sender.queues.pause("q") is True
    assert await sender.queues.pause("q") is False
    await sender.queues.pause("solo")
    job_id = await sender.send("q", {})
    await sender.send("solo", {}, singleton_key="k")
    assert await store.claim("q", 10) == []
    assert await store.claim("solo", 10, one_per_key=True) == []
    probe = await db.fetchrow(
        pool, SQL.probe, queues=["q", "solo"], stale_seconds=30.0, min_retention=3600.0
    )
    assert probe is not None
    assert list(probe["due"]) == []
    assert await sender.queues.resume("q") is True
    assert [job.id for job in await store.claim("q", 10)] == [job_id]


async def test_resume_wakes_listening_workers(
    pool: asyncpg.Pool, sender: Sender, db_url: str
) -> None:
    """Resume notifies the queue's channel on commit, so idle replicas claim at once."""
    await make_queue(pool, "q")
    await sender.queues.pause("q")
    heard: list[str] = []
    listener = await asyncpg.connect(db_url)
    try:
        await listener.add_listener("chassis_jobs_jobs", lambda *a: heard.append(a[-1]))
        await sender.queues.resume("q")
        await listener.execute("SELECT 1")
    finally:
        await listener.close()
    assert heard == ["q"]


async def test_a_paused_queue_stays_paused_across_installs(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """An install (every boot runs one) never clears the pause flag."""
    await make_queue(pool, "q")
    await sender.queues.pause("q")
    await make_queue(pool, "q", retry_limit=5)
    assert await pool.fetchval("SELECT paused FROM jobs.queue WHERE name = 'q'") is True


async def test_purge_deletes_only_the_waiting_jobs(pool: asyncpg.Pool, sender: Sender) -> None:
    """Purge removes created and retry jobs of that queue; active and finished ones and other
    queues' jobs stay."""
    await make_queue(pool, "q")
    await make_queue(pool, "other")
    store = JobStore(pool, SQL, uuid.uuid4())
    running = await sender.send("q", {})
    await store.claim("q", 1)
    waiting = await sender.send_many("q", [{}, {}])
    await pool.execute("UPDATE jobs.job SET state = 'retry' WHERE id = $1", waiting[0])
    elsewhere = await sender.send("other", {})
    assert await sender.queues.purge("q") == 2
    rows = await pool.fetch("SELECT id FROM jobs.job ORDER BY id")
    assert [r["id"] for r in rows] == [running, elsewhere]


async def test_queue_actions_are_audited_and_unknown_queues_refused(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """Each action writes one audit row naming the queue; an unknown queue raises QueueNotFound
    and writes nothing."""
    await make_queue(pool, "q")
    await sender.queues.pause("q")
    await sender.queues.resume("q")
    await sender.queues.purge("q")
    with pytest.raises(QueueNotFound):
        await sender.queues.pause("nope")
    rows = await pool.fetch(
        "SELECT action, resource_type, resource_id FROM public.audit_log ORDER BY id"
    )
    assert [tuple(r) for r in rows] == [
        ("queue.pause", "queue", "q"),
        ("queue.resume", "queue", "q"),
        ("queue.purge", "queue", "q"),
    ]
