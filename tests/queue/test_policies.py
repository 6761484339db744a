"""Queue policies (pg-boss's short, singleton, stately) and singleton keys under concurrency."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from api_sender import Sender
from tests.support.queues import make_queue
from worker.queue.sql import render
from worker.queue.store import JobStore

SQL = render("jobs")


def store_for(pool: asyncpg.Pool) -> JobStore:
    """A store with a fresh owner id."""
    return JobStore(pool, SQL, uuid.uuid4())


async def test_standard_queue_key_is_only_a_label(pool, sender: Sender) -> None:
    """On a standard queue, jobs with the same singleton key all go in."""
    await make_queue(pool, "q")
    ids = [await sender.send("q", {}, singleton_key="k") for _ in range(3)]
    assert None not in ids


async def test_short_allows_one_queued_job_per_key(pool, sender: Sender) -> None:
    """short: a second send of a queued key returns None; once it runs, a new one is queued."""
    await make_queue(pool, "q", policy="short")
    first = await sender.send("q", {}, singleton_key="k")
    assert first is not None
    assert await sender.send("q", {}, singleton_key="k") is None
    assert await sender.send("q", {}, singleton_key="other") is not None
    store = store_for(pool)
    await store.claim("q", 10)
    assert await sender.send("q", {}, singleton_key="k") is not None


async def test_singleton_runs_one_job_per_key_at_a_time(pool, sender: Sender) -> None:
    """singleton: while one job of a key is active, no other job of that key is claimed."""
    await make_queue(pool, "q", policy="singleton")
    a1 = await sender.send("q", {}, singleton_key="a")
    a2 = await sender.send("q", {}, singleton_key="a")
    b1 = await sender.send("q", {}, singleton_key="b")
    store = store_for(pool)
    first = await store.claim("q", 10, one_per_key=True)
    assert sorted(j.id for j in first) == sorted([a1, b1])
    assert await store.claim("q", 10, one_per_key=True) == []
    await store.complete([j for j in first if j.id == a1])
    assert [j.id for j in await store.claim("q", 10, one_per_key=True)] == [a2]


async def test_stately_one_queued_and_one_active(pool, sender: Sender) -> None:
    """stately: one queued and one active job per key."""
    await make_queue(pool, "q", policy="stately")
    first = await sender.send("q", {}, singleton_key="k")
    assert await sender.send("q", {}, singleton_key="k") is None
    store = store_for(pool)
    [active] = await store.claim("q", 10, one_per_key=True)
    assert active.id == first
    second = await sender.send("q", {}, singleton_key="k")
    assert second is not None
    assert await sender.send("q", {}, singleton_key="k") is None
    assert await store.claim("q", 10, one_per_key=True) == []


async def test_concurrent_claims_never_run_two_of_a_key(pool, sender: Sender) -> None:
    """Racing claimers on a singleton queue never hold two active jobs of one key."""
    await make_queue(pool, "q", policy="singleton")
    for _ in range(20):
        await sender.send("q", {}, singleton_key="k")
    stores = [store_for(pool) for _ in range(6)]
    results = await asyncio.gather(*(s.claim("q", 5, one_per_key=True) for s in stores))
    assert sum(len(r) for r in results) == 1
    active = await pool.fetchval("SELECT count(*) FROM jobs.job WHERE state = 'active'")
    assert active == 1


async def test_fifty_concurrent_sends_of_one_key(pool, sender: Sender) -> None:
    """50 tasks sending one key to a short queue: exactly one row; the others get None."""
    await make_queue(pool, "q", policy="short")
    results = await asyncio.gather(
        *(sender.send("q", {"n": i}, singleton_key="k") for i in range(50))
    )
    assert sum(r is not None for r in results) == 1
    assert await pool.fetchval("SELECT count(*) FROM jobs.job") == 1


async def test_failed_singleton_can_retry_beside_a_queued_one(pool, sender: Sender) -> None:
    """A stately job failing to retry never collides with a newer queued job of its key."""
    await make_queue(pool, "q", policy="stately", retry_limit=2)
    await sender.send("q", {}, singleton_key="k")
    store = store_for(pool)
    [job] = await store.claim("q", 1, one_per_key=True)
    assert await sender.send("q", {}, singleton_key="k") is not None
    [outcome] = await store.fail([(job, "boom")])
    assert outcome.state == "retry"


async def test_stately_keeps_every_failed_job_of_a_key_in_retry(pool, sender: Sender) -> None:
    """stately, unlike pg-boss 10: a second job of a key failing while the first waits in retry
    goes to retry too (not to failed and the dead letter), and both run again, one at a time."""
    await make_queue(pool, "dead")
    await make_queue(pool, "q", policy="stately", retry_limit=2, dead_letter="dead")
    first = await sender.send("q", {}, singleton_key="k")
    store = store_for(pool)
    [job] = await store.claim("q", 10, one_per_key=True)
    second = await sender.send("q", {}, singleton_key="k")
    outcomes = await store.fail([(job, "boom")])
    [job] = await store.claim("q", 10, one_per_key=True)
    assert job.id == second
    outcomes += await store.fail([(job, "boom")])
    assert [(o.id, o.state) for o in outcomes] == [(first, "retry"), (second, "retry")]
    assert await pool.fetchval("SELECT count(*) FROM jobs.job WHERE queue = 'dead'") == 0
    [again] = await store.claim("q", 10, one_per_key=True)
    assert await store.claim("q", 10, one_per_key=True) == []
    await store.complete([again])
    [last] = await store.claim("q", 10, one_per_key=True)
    assert {again.id, last.id} == {first, second}
