"""A queue's policy changed by a later install applies to the jobs already waiting on it."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from api_sender import Sender
from tests.support.queues import make_queue
from worker.queue.sql import render
from worker.queue.store import JobStore

SQL = render("jobs")


def store_for(pool: asyncpg.Pool) -> JobStore:
    """A store with a fresh owner id."""
    return JobStore(pool, SQL, uuid.uuid4())


async def policies(pool: asyncpg.Pool) -> dict[int, tuple[str, str]]:
    """Job id -> (state, policy)."""
    rows = await pool.fetch("SELECT id, state::text, policy FROM jobs.job")
    return {r["id"]: (r["state"], r["policy"]) for r in rows}


async def test_singleton_to_standard_frees_the_waiting_jobs(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """singleton -> standard: every waiting job of a key, beside its running one, is claimed by
    the plain claim, with or without completions riding along."""
    await make_queue(pool, "q", policy="singleton")
    for key in ("a", "a", "a", "b", "b"):
        await sender.send("q", {}, singleton_key=key)
    old = store_for(pool)
    running = await old.claim("q", 10, one_per_key=True)
    assert len(running) == 2
    await make_queue(pool, "q", policy="standard")
    new = store_for(pool)
    first = await new.claim("q", 2)
    assert len(first) == 2
    rest, lost = await new.complete_and_claim(first, "q", 10)
    assert (len(rest), lost) == (1, set())
    await old.complete(running)
    states = [state for state, _ in (await policies(pool)).values()]
    assert sorted(states) == ["active"] + ["completed"] * 4


async def test_standard_to_short_applies_where_no_key_waits_twice(
    pool: asyncpg.Pool, sender: Sender, captured_logs
) -> None:
    """standard -> short: a job waiting alone for its key and a job in retry take the new
    policy, so a second send of that key is refused; the jobs of a key already waiting twice
    keep theirs (the install cannot refuse them after the fact), all of them run, and the
    install says how many it left."""
    await make_queue(pool, "q", retry_limit=3)
    a1 = await sender.send("q", {}, singleton_key="a")
    a2 = await sender.send("q", {}, singleton_key="a")
    b1 = await sender.send("q", {}, singleton_key="b")
    retried = await sender.send("q", {}, singleton_key="a", priority=1)
    store = store_for(pool)
    [job] = await store.claim("q", 1)
    assert job.id == retried
    assert [o.state for o in await store.fail([(job, "boom")])] == ["retry"]
    await make_queue(pool, "q", policy="short", retry_limit=3)
    assert await policies(pool) == {
        a1: ("created", "standard"),
        a2: ("created", "standard"),
        b1: ("created", "short"),
        retried: ("retry", "short"),
    }
    assert await sender.send("q", {}, singleton_key="b") is None
    assert await sender.send("q", {}, singleton_key="c") is not None
    [changed] = [e for e in captured_logs if e["event"] == "install.policy_changed"]
    assert (changed["queue"], changed["old"], changed["new"]) == ("q", "standard", "short")
    assert (changed["moved"], changed["kept"]) == (2, 2)
    assert len(await store.claim("q", 10)) == 5


async def test_standard_to_singleton_leaves_running_jobs_as_they_are(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """standard -> singleton with two jobs of one key running: the install goes through, the
    waiting job of that key takes the new policy and waits until both have finished."""
    await make_queue(pool, "q")
    for _ in range(3):
        await sender.send("q", {}, singleton_key="a")
    store = store_for(pool)
    running = await store.claim("q", 2)
    await make_queue(pool, "q", policy="singleton")
    assert sorted((await policies(pool)).values()) == [
        ("active", "standard"),
        ("active", "standard"),
        ("created", "singleton"),
    ]
    assert await store.claim("q", 10, one_per_key=True) == []
    await store.complete(running)
    assert len(await store.claim("q", 10, one_per_key=True)) == 1


async def test_an_unchanged_policy_writes_no_job(pool: asyncpg.Pool, sender: Sender) -> None:
    """Re-installing a queue with its policy unchanged leaves its jobs' rows untouched."""
    await make_queue(pool, "q", policy="short")
    await sender.send("q", {}, singleton_key="a")
    before = await pool.fetchval("SELECT xmin::text FROM jobs.job")
    await make_queue(pool, "q", policy="short", retry_limit=5)
    assert await pool.fetchval("SELECT xmin::text FROM jobs.job") == before


@pytest.mark.parametrize("carrying", [False, True])
async def test_a_claim_meeting_a_stricter_job_policy_still_claims(
    pool: asyncpg.Pool, sender: Sender, carrying: bool
) -> None:
    """Jobs that still carry singleton on a standard queue (sent while the policy changed):
    the plain claim takes one per key instead of none, and a claim carrying completions
    writes them and never raises."""
    await make_queue(pool, "q")
    for key in ("a", "a", "b"):
        await sender.send("q", {}, singleton_key=key)
    store = store_for(pool)
    done = []
    if carrying:
        await sender.send("q", {}, priority=1)
        done = await store.claim("q", 1)
    await pool.execute("UPDATE jobs.job SET policy = 'singleton' WHERE state = 'created'")
    if carrying:
        claimed, lost = await store.complete_and_claim(done, "q", 10)
        assert lost == set()
        assert await pool.fetchval(
            "SELECT state::text FROM jobs.job WHERE id = $1", done[0].id
        ) == ("completed")
    else:
        claimed = await store.claim("q", 10)
    assert sorted(j.singleton_key for j in claimed) == ["a", "b"]
