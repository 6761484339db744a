"""Maintenance: rescue of a dead worker's jobs, expiry, retention pruning, one replica at a time."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid

import asyncpg

from api_sender import Sender
from tests.support.queues import make_queue
from worker.db import statements as db
from worker.queue.availability import Availability
from worker.queue.maintenance import Maintenance
from worker.queue.sql import render
from worker.queue.store import JobStore

SQL = render("jobs")
STALE = 30.0


def maintenance_for(pool: asyncpg.Pool) -> Maintenance:
    """Maintenance with the default 30 s stale limit."""
    return Maintenance(
        JobStore(pool, SQL, uuid.uuid4()), SQL, "jobs", interval=60, stale_seconds=STALE
    )


async def age_claims(pool: asyncpg.Pool, seconds: int) -> None:
    """Pretend every active claim happened ``seconds`` ago."""
    await pool.execute(
        "UPDATE jobs.job SET started_at = now() - make_interval(secs => $1) WHERE state = 'active'",
        seconds,
    )


async def test_dead_workers_job_is_rescued_as_a_failed_attempt(pool, sender: Sender) -> None:
    """An active job whose worker never beat, claimed longer ago than the stale limit, retries."""
    await make_queue(pool, "q", retry_limit=2)
    job_id = await sender.send("q", {})
    dead = JobStore(pool, SQL, uuid.uuid4())
    await dead.claim("q", 1)
    await age_claims(pool, 31)
    rescued, _ = await maintenance_for(pool).run_once(prune=False)
    assert rescued == 1
    row = await pool.fetchrow(
        "SELECT state::text, retry_count, output FROM jobs.job WHERE id = $1", job_id
    )
    assert (row["state"], row["retry_count"]) == ("retry", 1)
    assert "worker lost" in row["output"]


async def test_live_worker_keeps_its_jobs(pool, sender: Sender) -> None:
    """A worker that beat recently keeps its old claims; a fresh claim is never rescued."""
    await make_queue(pool, "q")
    await sender.send("q", {})
    await sender.send("q", {})
    alive = JobStore(pool, SQL, uuid.uuid4())
    await alive.claim("q", 1)
    await age_claims(pool, 300)
    await db.execute(
        pool, SQL.heartbeat, owner=alive.owner, host=socket.gethostname(), pid=os.getpid()
    )
    other = JobStore(pool, SQL, uuid.uuid4())
    await other.claim("q", 1)  # fresh claim by a worker with no row at all
    rescued, _ = await maintenance_for(pool).run_once(prune=False)
    assert rescued == 0


async def test_stale_heartbeat_lets_the_job_go(pool, sender: Sender) -> None:
    """A worker whose last beat is older than the stale limit is dead: its jobs are rescued."""
    await make_queue(pool, "q")
    await sender.send("q", {})
    frozen = JobStore(pool, SQL, uuid.uuid4())
    [job] = await frozen.claim("q", 1)
    await db.execute(pool, SQL.heartbeat, owner=frozen.owner, host="h", pid=1)
    await pool.execute("UPDATE jobs.worker SET heartbeat_at = now() - interval '1 minute'")
    await age_claims(pool, 60)
    assert (await maintenance_for(pool).run_once(prune=False))[0] == 1
    # The frozen worker wakes up and completes late: nothing changes, it is told so.
    assert await frozen.complete([job]) == set()


async def test_after_an_outage_nothing_is_rescued_for_a_stale_interval(
    pool, sender: Sender, captured_logs
) -> None:
    """A replica whose database was just lost and back rescues neither a silent worker's job
    nor an expired one until it has had the stale limit of database; then both go."""
    await make_queue(pool, "q", expire_seconds=10)
    await sender.send_many("q", [{}, {}])
    silent = JobStore(pool, SQL, uuid.uuid4())
    await silent.claim("q", 1)
    beating = JobStore(pool, SQL, uuid.uuid4())
    await beating.claim("q", 1)
    await age_claims(pool, 11)
    await db.execute(pool, SQL.heartbeat, owner=beating.owner, host="h", pid=1)
    availability = Availability()
    availability.lost()
    availability.answered()
    stale = 1.0
    maintenance = Maintenance(
        JobStore(pool, SQL, uuid.uuid4()),
        SQL,
        "jobs",
        interval=60,
        stale_seconds=stale,
        availability=availability,
    )
    assert await maintenance.run_once(prune=False) == (0, 0)
    assert await maintenance.run_once(prune=False) == (0, 0)
    deferred = [e for e in captured_logs if e["event"] == "maintenance.rescue_deferred"]
    assert len(deferred) == 1
    while availability.seconds() < stale:
        await asyncio.sleep(0.05)
    assert (await maintenance.run_once(prune=False))[0] == 2


async def test_expired_job_counts_as_failed_attempt(pool, sender: Sender) -> None:
    """An active job past its expire_seconds is failed even if its worker is alive."""
    await make_queue(pool, "q", retry_limit=0, expire_seconds=10)
    job_id = await sender.send("q", {})
    store = JobStore(pool, SQL, uuid.uuid4())
    await store.claim("q", 1)
    await db.execute(pool, SQL.heartbeat, owner=store.owner, host="h", pid=1)
    await age_claims(pool, 11)
    assert (await maintenance_for(pool).run_once(prune=False))[0] == 1
    row = await pool.fetchrow("SELECT state::text, output FROM jobs.job WHERE id = $1", job_id)
    assert row["state"] == "failed"
    assert "expired" in row["output"]


async def test_a_job_that_kills_its_worker_runs_out_of_attempts(pool, sender: Sender) -> None:
    """Each rescue counts: a job whose worker always dies ends failed, then dead-lettered."""
    await make_queue(pool, "dlq")
    await make_queue(pool, "q", retry_limit=2, dead_letter="dlq")
    job_id = await sender.send("q", {"poison": True})
    for _ in range(3):
        await pool.execute("UPDATE jobs.job SET start_after = now() WHERE id = $1", job_id)
        await JobStore(pool, SQL, uuid.uuid4()).claim("q", 1)
        await age_claims(pool, 31)
        await maintenance_for(pool).run_once(prune=False)
    assert await pool.fetchval("SELECT state::text FROM jobs.job WHERE id = $1", job_id) == "failed"
    assert await pool.fetchval("SELECT count(*) FROM jobs.job WHERE queue = 'dlq'") == 1


async def test_prune_removes_only_jobs_past_retention(pool, sender: Sender) -> None:
    """Completed jobs go after the queue's retention, failed ones after failed retention."""
    await make_queue(pool, "q", retention_seconds=3600, failed_retention_seconds=7 * 86400)
    ids = await sender.send_many("q", [{"n": i} for i in range(4)])
    await pool.execute(
        """UPDATE jobs.job SET state = s.state::jobs.job_state,
               completed_at = now() - make_interval(secs => s.age)
           FROM (VALUES ($1::bigint, 'completed', 7200), ($2::bigint, 'completed', 60),
                        ($3::bigint, 'failed', 7200), ($4::bigint, 'failed', 8 * 86400))
                AS s(id, state, age)
           WHERE jobs.job.id = s.id""",
        *ids,
    )
    _, pruned = await maintenance_for(pool).run_once(prune=True)
    assert pruned == 2
    left = {r["id"] for r in await pool.fetch("SELECT id FROM jobs.job")}
    assert left == {ids[1], ids[2]}


async def test_one_replica_runs_maintenance_at_a_time(pool, sender: Sender) -> None:
    """While one replica holds the maintenance lock, another's pass does nothing."""
    await make_queue(pool, "q")
    await sender.send("q", {})
    await JobStore(pool, SQL, uuid.uuid4()).claim("q", 1)
    await age_claims(pool, 31)
    async with pool.acquire() as holder, holder.transaction():
        await holder.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('chassis-worker:maintenance:jobs', 0))"
        )
        assert await maintenance_for(pool).run_once(prune=False) == (0, 0)
    assert (await maintenance_for(pool).run_once(prune=False))[0] == 1


async def test_probe_finds_due_work_below_a_future_only_priority(pool, sender: Sender) -> None:
    """Due work in a lower priority is found even when the top priority holds only future jobs,
    and the next due time is the earliest future job of any priority."""
    await make_queue(pool, "q")
    await sender.send_many("q", [{} for _ in range(50)], priority=9, start_after=120)
    await sender.send("q", {}, priority=5, start_after=40)
    row = await db.fetchrow(
        pool, SQL.probe, queues=["q"], stale_seconds=STALE, min_retention=3600.0
    )
    assert list(row["due"]) == []
    assert 39 < row["next_due_in"].total_seconds() <= 40
    await sender.send("q", {}, priority=1)
    row = await db.fetchrow(
        pool, SQL.probe, queues=["q"], stale_seconds=STALE, min_retention=3600.0
    )
    assert list(row["due"]) == ["q"]
    assert 39 < row["next_due_in"].total_seconds() <= 40


async def test_probe_reports_due_queues_and_rescue(pool, sender: Sender) -> None:
    """The idle probe names queues with due work, the next due time, and a pending rescue."""
    await make_queue(pool, "a")
    await make_queue(pool, "b")
    await sender.send("a", {})
    await sender.send("b", {}, start_after=30)
    row = await db.fetchrow(
        pool, SQL.probe, queues=["a", "b"], stale_seconds=STALE, min_retention=3600.0
    )
    assert list(row["due"]) == ["a"]
    assert 29 < row["next_due_in"].total_seconds() <= 30
    assert row["rescue"] is False
    assert row["prunable"] is False
    await JobStore(pool, SQL, uuid.uuid4()).claim("a", 1)
    await age_claims(pool, 31)
    assert (
        await db.fetchrow(
            pool, SQL.probe, queues=["a", "b"], stale_seconds=STALE, min_retention=3600.0
        )
    )["rescue"] is True
