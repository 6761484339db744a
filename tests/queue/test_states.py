"""The job state machine: claim, complete, fail, retry with backoff, dead letter, hand back."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta

import asyncpg
import pytest

from api_sender import Sender
from tests.support.queues import make_queue
from worker.db import statements as db
from worker.queue.jobs import ClaimedJob, claim_token
from worker.queue.maintenance import Maintenance
from worker.queue.sql import render
from worker.queue.store import JobStore

SQL = render("jobs")


def store_for(pool: asyncpg.Pool) -> JobStore:
    """A store with a fresh owner id, like one worker process."""
    return JobStore(pool, SQL, uuid.uuid4())


async def job_row(pool: asyncpg.Pool, job_id: int) -> asyncpg.Record:
    """The job's row, with the database clock."""
    row = await pool.fetchrow(
        "SELECT *, state::text AS st, now() AS db_now FROM jobs.job WHERE id = $1", job_id
    )
    assert row is not None
    return row


async def test_claim_marks_active_with_owner_and_attempt(pool, sender: Sender) -> None:
    """A claim moves a created job to active, records the owner and counts the attempt."""
    await make_queue(pool, "q")
    job_id = await sender.send("q", {"n": 1})
    assert (await job_row(pool, job_id))["st"] == "created"
    store = store_for(pool)
    [job] = await store.claim("q", 5)
    row = await job_row(pool, job_id)
    assert (row["st"], row["locked_by"], row["attempt"]) == ("active", store.owner, 1)
    assert job.attempt == 1
    assert row["started_at"] is not None


async def test_complete_is_fenced_on_owner_and_attempt(pool, sender: Sender) -> None:
    """Only the claiming owner, for the current attempt, can complete a job."""
    await make_queue(pool, "q")
    job_id = await sender.send("q", {})
    store = store_for(pool)
    [job] = await store.claim("q", 1)
    intruder = JobStore(pool, SQL, uuid.uuid4())
    assert await intruder.complete([job]) == set()
    job.attempt += 1
    assert await store.complete([job]) == set()
    job.attempt -= 1
    assert await store.complete([job]) == {job_id}
    assert (await job_row(pool, job_id))["st"] == "completed"


async def test_fail_below_limit_retries_after_the_delay(pool, sender: Sender) -> None:
    """A failed attempt below the retry limit waits retry_delay seconds in state retry."""
    await make_queue(pool, "q", retry_limit=2, retry_delay=30)
    job_id = await sender.send("q", {})
    store = store_for(pool)
    [job] = await store.claim("q", 1)
    [outcome] = await store.fail([(job, "boom")])
    assert outcome.state == "retry"
    row = await job_row(pool, job_id)
    assert row["st"] == "retry"
    assert row["retry_count"] == 1
    wait = row["start_after"] - row["db_now"]
    assert timedelta(seconds=29) < wait <= timedelta(seconds=30)
    assert await store.claim("q", 1) == []


async def test_backoff_doubles_the_delay_each_retry(pool, sender: Sender) -> None:
    """With backoff, the n-th retry waits delay * 2^(n-1): 10, 20, 40, 80 seconds."""
    await make_queue(pool, "q", retry_limit=4, retry_delay=10, retry_backoff=True)
    job_id = await sender.send("q", {})
    store = store_for(pool)
    waits = []
    for _ in range(4):
        await pool.execute("UPDATE jobs.job SET start_after = now() WHERE id = $1", job_id)
        [job] = await store.claim("q", 1)
        await store.fail([(job, "boom")])
        row = await job_row(pool, job_id)
        waits.append(round((row["start_after"] - row["db_now"]).total_seconds()))
    assert waits == [10, 20, 40, 80]


async def test_send_overrides_the_queue_retry_policy(pool, sender: Sender) -> None:
    """Per-send retry options win over the queue's."""
    await make_queue(pool, "q", retry_limit=0)
    job_id = await sender.send("q", {}, retry_limit=1, retry_delay=5)
    store = store_for(pool)
    [job] = await store.claim("q", 1)
    [outcome] = await store.fail([(job, "boom")])
    assert outcome.state == "retry"
    row = await job_row(pool, job_id)
    assert round((row["start_after"] - row["db_now"]).total_seconds()) == 5


async def test_exhausted_job_fails_and_copies_to_dead_letter(pool, sender: Sender) -> None:
    """At the retry limit the job is failed and its data is sent to the dead-letter queue."""
    await make_queue(pool, "dlq", retry_limit=7)
    await make_queue(pool, "q", retry_limit=1, dead_letter="dlq")
    job_id = await sender.send("q", {"keep": "me"}, priority=3)
    store = store_for(pool)
    states = []
    for _ in range(2):
        await pool.execute("UPDATE jobs.job SET start_after = now() WHERE id = $1", job_id)
        [job] = await store.claim("q", 1)
        [outcome] = await store.fail([(job, "boom")])
        states.append(outcome.state)
    assert states == ["retry", "failed"]
    row = await job_row(pool, job_id)
    assert row["st"] == "failed"
    assert row["completed_at"] is not None
    assert "boom" in row["output"]
    copies = await pool.fetch(
        "SELECT data::text, retry_limit, priority, state::text FROM jobs.job WHERE queue = 'dlq'"
    )
    assert [(c["data"], c["retry_limit"], c["state"]) for c in copies] == [
        ('{"keep": "me"}', 7, "created")
    ]


async def test_failed_job_without_dead_letter_stays_failed(pool, sender: Sender) -> None:
    """A queue without a dead letter keeps the failed job and copies nothing."""
    await make_queue(pool, "q", retry_limit=0)
    await sender.send("q", {})
    store = store_for(pool)
    [job] = await store.claim("q", 1)
    [outcome] = await store.fail([(job, "boom")])
    assert outcome.state == "failed"
    assert await pool.fetchval("SELECT count(*) FROM jobs.job") == 1


async def test_hand_back_does_not_burn_an_attempt(pool, sender: Sender) -> None:
    """A job handed back (shutdown) is due at once and its retry count is unchanged."""
    await make_queue(pool, "q", retry_limit=1, retry_delay=60)
    job_id = await sender.send("q", {})
    store = store_for(pool)
    [job] = await store.claim("q", 1)
    assert await store.hand_back([job]) == {job_id}
    row = await job_row(pool, job_id)
    assert (row["st"], row["retry_count"], row["locked_by"]) == ("retry", 0, None)
    assert row["start_after"] <= row["db_now"]
    [again] = await store.claim("q", 1)
    assert again.attempt == 2


async def test_late_fail_after_rescue_changes_nothing(pool, sender: Sender) -> None:
    """A failure written by a worker whose claim was superseded matches no row."""
    await make_queue(pool, "q", retry_limit=3)
    job_id = await sender.send("q", {})
    old = store_for(pool)
    [stale] = await old.claim("q", 1)
    await old.hand_back([stale])
    new = store_for(pool)
    [fresh] = await new.claim("q", 1)
    assert await old.fail([(stale, "late")]) == []
    assert await old.complete([stale]) == set()
    row = await job_row(pool, job_id)
    assert (row["st"], row["locked_by"], row["attempt"]) == ("active", new.owner, fresh.attempt)


@pytest.mark.parametrize("state", ["completed", "failed", "cancelled"])
async def test_terminal_jobs_are_never_claimed(pool, sender: Sender, state: str) -> None:
    """Completed, failed and cancelled jobs stay out of every claim."""
    await make_queue(pool, "q")
    job_id = await sender.send("q", {})
    await pool.execute(f"UPDATE jobs.job SET state = '{state}' WHERE id = $1", job_id)
    assert await store_for(pool).claim("q", 10) == []


async def lose_claim(pool: asyncpg.Pool, job_id: int) -> None:
    """Put the job back exactly as a server crash that lost its (lazily committed) claim
    would leave it: waiting again, under its old attempt, with no owner."""
    await pool.execute(
        "UPDATE jobs.job SET state = 'created', attempt = attempt - 1, locked_by = NULL,"
        " started_at = NULL WHERE id = $1",
        job_id,
    )


async def write_outcome(store: JobStore, job: ClaimedJob, write: str) -> bool:
    """Write ``job``'s outcome through ``write``; whether it matched the job's row."""
    if write == "complete":
        return await store.complete([job]) == {job.id}
    if write == "complete_lost":
        return await store.complete_lost([job]) == set()
    if write == "complete_and_claim":
        _, lost = await store.complete_and_claim([job], job.queue, 1)
        return lost == set()
    if write == "fail":
        return [o.id for o in await store.fail([(job, "boom")])] == [job.id]
    assert write == "hand_back"
    return await store.hand_back([job]) == {job.id}


@pytest.mark.parametrize(
    "write", ["complete", "complete_lost", "complete_and_claim", "fail", "hand_back"]
)
async def test_an_outcome_of_a_lost_claim_never_settles_a_later_claim(
    pool, sender: Sender, write: str
) -> None:
    """When a claim is lost and the same worker claims the job again under the same attempt
    number, the first claim's outcome matches nothing (lease lost) and the second's matches."""
    await make_queue(pool, "q", retry_limit=3)
    job_id = await sender.send("q", {})
    store = store_for(pool)
    [first] = await store.claim("q", 1)
    await lose_claim(pool, job_id)
    [second] = await store.claim("q", 1)
    assert (second.id, second.attempt) == (first.id, first.attempt)
    assert not await write_outcome(store, first, write)
    row = await job_row(pool, job_id)
    assert (row["st"], row["locked_by"], row["attempt"]) == ("active", store.owner, 1)
    assert await write_outcome(store, second, write)


@pytest.mark.parametrize("stale_last", [False, True], ids=["stale_first", "stale_last"])
@pytest.mark.parametrize("write", ["complete", "complete_lost", "complete_and_claim"])
async def test_a_batch_listing_a_job_under_both_claims_completes_the_current_one(
    pool, sender: Sender, write: str, stale_last: bool
) -> None:
    """One completion batch carrying a job twice, the outcome of its lost claim and that of its
    current claim (same id and attempt), in either order, completes the job: each row matches
    any of its entries, not only its last (the one the statement looks at first)."""
    await make_queue(pool, "q", retry_limit=3)
    job_id = await sender.send("q", {})
    other_id = await sender.send("q", {})
    store = store_for(pool)
    [first] = await store.claim("q", 1)
    await lose_claim(pool, job_id)
    second, other = sorted(await store.claim("q", 2), key=lambda j: j.id)
    assert (second.id, other.id) == (job_id, other_id)
    batch = [other, second, first] if stale_last else [other, first, second]
    if write == "complete":
        assert await store.complete(batch) == {job_id, other_id}
    elif write == "complete_lost":
        assert await store.complete_lost(batch) == {job_id}  # the stale entry, once
    else:
        _, lost = await store.complete_and_claim(batch, "q", 1)
        assert lost == {job_id}
    for done in (job_id, other_id):
        assert (await job_row(pool, done))["st"] == "completed"


@pytest.mark.parametrize("write", ["complete", "complete_lost", "complete_and_claim"])
async def test_a_shuffled_batch_of_two_claims_matches_each_job_by_its_own_entry(
    pool, sender: Sender, write: str
) -> None:
    """Completions handed over in any order, from two claims, match each job by its own
    attempt and claim instant (the statement finds a row's entries by binary search over the
    sorted ids): an entry whose claim instant is not the job's matches nothing and is lost."""
    await make_queue(pool, "q", retry_limit=3)
    await sender.send_many("q", [{"n": n} for n in range(60)])
    store = store_for(pool)
    jobs = await store.claim("q", 30) + await store.claim("q", 30)
    assert len({job.started_at for job in jobs}) == 2
    stale = replace(jobs[7], claim=claim_token(jobs[7].started_at - timedelta(seconds=1)))
    rest = jobs[:7] + jobs[8:]
    batch = [*rest[::-1][1::2], stale, *rest[::-1][::2]]  # interleaved and reversed
    if write == "complete":
        assert await store.complete(batch) == {job.id for job in rest}
    elif write == "complete_lost":
        assert await store.complete_lost(batch) == {stale.id}
    else:
        _, lost = await store.complete_and_claim(batch, "q", 1)
        assert lost == {stale.id}
    states = await pool.fetch("SELECT id, state::text AS st FROM jobs.job")
    assert {row["id"] for row in states if row["st"] == "active"} == {stale.id}
    assert sum(row["st"] == "completed" for row in states) == 59


async def test_a_rescue_of_a_lost_claim_never_settles_a_later_claim(pool, sender: Sender) -> None:
    """A rescue chosen while the first claim was stale matches nothing once that claim was lost
    and the job claimed again under the same owner and attempt; the new claim runs on."""
    await make_queue(pool, "q", retry_limit=3)
    job_id = await sender.send("q", {})
    store = store_for(pool)
    await store.claim("q", 1)
    await pool.execute("UPDATE jobs.job SET started_at = now() - interval '1 minute'")
    candidates = await db.fetch(pool, SQL.rescue_candidates, stale_seconds=30.0, limit=10)
    assert [r["id"] for r in candidates] == [job_id]
    await lose_claim(pool, job_id)
    [second] = await store.claim("q", 1)
    maintenance = Maintenance(store_for(pool), SQL, "jobs", interval=60, stale_seconds=30)
    assert await maintenance.rescue(candidates) == 0
    row = await job_row(pool, job_id)
    assert (row["st"], row["locked_by"], row["attempt"]) == ("active", store.owner, 1)
    assert await store.complete([second]) == {job_id}
