"""Final failures: a job that can never succeed fails at once, whatever retries it has left,
to its dead letter, through the one fenced fail statement (store, completer and poller)."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import timedelta

import asyncpg
from prometheus_client import REGISTRY

from api_sender import Sender
from tests.queue.test_poller import run_until
from tests.support.queues import make_queue
from worker.queue.completer import Completer
from worker.queue.holdings import Holdings
from worker.queue.jobs import ClaimedJob, FinalFailure, claim_token
from worker.queue.poller import Consumer
from worker.queue.sql import render
from worker.queue.store import JobStore

SQL = render("jobs")


async def with_dead_letter(pool: asyncpg.Pool, retry_limit: int = 5) -> None:
    """Queue ``src`` with ``retry_limit`` retries and its dead letter ``dead``."""
    await make_queue(pool, "dead")
    await make_queue(pool, "src", retry_limit=retry_limit, dead_letter="dead")


async def row(pool: asyncpg.Pool, job_id: int) -> asyncpg.Record:
    """A job's state, counters, finish instant and error."""
    found = await pool.fetchrow(
        "SELECT state::text AS state, attempt, retry_count, completed_at,"
        " output->>'error' AS error FROM jobs.job WHERE id = $1",
        job_id,
    )
    assert found is not None
    return found


async def copies(pool: asyncpg.Pool) -> list[str]:
    """The dead letter's jobs, their data as text, in id order."""
    rows = await pool.fetch("SELECT data::text AS d FROM jobs.job WHERE queue = 'dead' ORDER BY id")
    return [r["d"] for r in rows]


async def test_a_final_failure_fails_at_once_beside_an_ordinary_one(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """In one fail statement, a job marked final fails with five retries left and leaves its
    dead-letter copy, while an ordinary failure of the same queue goes to retry."""
    await with_dead_letter(pool)
    poison, plain = await sender.send_many("src", [{"n": "poison"}, {"n": "plain"}])
    store = JobStore(pool, SQL, uuid.uuid4())
    jobs = {job.id: job for job in await store.claim("src", 2)}
    outcomes = await store.fail(
        [(jobs[poison], "does not validate"), (jobs[plain], "boom")], final={poison}
    )
    assert {o.id: o.state for o in outcomes} == {poison: "failed", plain: "retry"}
    failed = await row(pool, poison)
    assert (failed["state"], failed["attempt"], failed["retry_count"]) == ("failed", 1, 1)
    assert failed["completed_at"] is not None
    assert failed["error"] == "does not validate"
    assert (await row(pool, plain))["state"] == "retry"
    assert await copies(pool) == ['{"n": "poison"}']


async def test_a_final_failure_is_fenced_like_any_failure(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """A final failure from another owner, for another attempt or another claim instant
    matches nothing: the job stays active and no copy is made."""
    await with_dead_letter(pool)
    job_id = await sender.send("src", {"n": 1})
    store = JobStore(pool, SQL, uuid.uuid4())
    [job] = await store.claim("src", 1)
    intruder = JobStore(pool, SQL, uuid.uuid4())
    other_attempt = dataclasses.replace(job, attempt=job.attempt + 1)
    other_claim = dataclasses.replace(
        job, claim=claim_token(job.started_at + timedelta(microseconds=1))
    )
    assert await intruder.fail([(job, "late")], final={job_id}) == []
    assert await store.fail([(other_attempt, "late")], final={job_id}) == []
    assert await store.fail([(other_claim, "late")], final={job_id}) == []
    assert (await row(pool, job_id))["state"] == "active"
    assert await copies(pool) == []


async def test_the_completer_writes_a_final_failure_and_counts_it(
    pool: asyncpg.Pool, sender: Sender, captured_logs
) -> None:
    """A failure the completer records as final is written as failed with its copy, logged
    job.failed (final) and counted in jobs_failed_total like any failure."""
    await with_dead_letter(pool)
    job_id = await sender.send("src", {"n": 1})
    store = JobStore(pool, SQL, uuid.uuid4())
    holdings = Holdings()
    completer = Completer(store, holdings)
    [job] = await store.claim("src", 1)
    holdings.add(1)
    before = REGISTRY.get_sample_value("jobs_failed_total", {"queue": "src"}) or 0.0
    completer.failed(job, "does not validate", final=True)
    await completer.flush()
    assert (await row(pool, job_id))["state"] == "failed"
    assert await copies(pool) == ['{"n": 1}']
    assert REGISTRY.get_sample_value("jobs_failed_total", {"queue": "src"}) == before + 1
    [event] = [e for e in captured_logs if e["event"] == "job.failed"]
    assert (event["job_id"], event["next_state"], event.get("final")) == (job_id, "failed", True)
    assert holdings.count == 0


async def test_a_runner_raising_final_failure_is_attempted_once(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """A job whose runner raises FinalFailure runs once, even with five retries, and ends
    failed with the runner's error and its dead-letter copy."""
    await with_dead_letter(pool)
    job_id = await sender.send("src", {"n": 1})
    runs: list[int] = []

    async def runner(job: ClaimedJob) -> None:
        runs.append(job.attempt)
        raise FinalFailure("can never succeed")

    async def settled() -> bool:
        return (await row(pool, job_id))["state"] not in ("created", "active", "retry")

    await run_until(pool, Consumer("src", run_job=runner), settled)
    failed = await row(pool, job_id)
    assert (failed["state"], failed["error"]) == ("failed", "can never succeed")
    assert runs == [1]
    assert await copies(pool) == ['{"n": 1}']
