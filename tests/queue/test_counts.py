"""Queue counts (contract section 9): exact at every step, whatever statement changed the jobs,
and cheap however many finished jobs are retained."""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import pytest

from api_sender import Sender
from tests.support.counts import (
    add_finished_jobs,
    counter_sums,
    finished_table_counts,
    reported_counts,
    table_counts,
)
from tests.support.queues import make_queue
from worker.db import migrations
from worker.db import statements as db
from worker.gauges import QueueGauges
from worker.metrics import QUEUE_JOBS, QUEUE_OLDEST_WAITING
from worker.queue.jobs import ClaimedJob
from worker.queue.maintenance import Maintenance
from worker.queue.sql import render
from worker.queue.store import JobStore

SQL = render("jobs")


async def assert_exact(pool: asyncpg.Pool) -> int:
    """The report equals the table, and the counters equal its finished part (returned)."""
    truth = await table_counts(pool)
    assert await reported_counts(pool) == truth
    finished = await counter_sums(pool)
    assert finished == await finished_table_counts(pool)
    return sum(finished.values())


def buffers(plan: dict[str, object]) -> int:
    """Shared buffers a plan touched (its top node counts its children's)."""
    return int(str(plan["Shared Hit Blocks"])) + int(str(plan["Shared Read Blocks"]))


async def test_the_count_reads_no_finished_row(pool: asyncpg.Pool, sender: Sender) -> None:
    """With 20,000 completed jobs retained, the count touches a few dozen buffers (the counters
    and the waiting set's index), not the finished rows, and never scans the job table."""
    await make_queue(pool, "q")
    await add_finished_jobs(pool, "q", 20_000)
    await sender.send_many("q", [{} for _ in range(10)])
    await pool.execute("ANALYZE jobs.job")
    async with pool.acquire() as conn, conn.transaction(readonly=True):
        await conn.execute("SET LOCAL jit = off")
        [plan] = json.loads(
            await conn.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + SQL.counts.text)
        )
    text = json.dumps(plan)
    assert "Seq Scan on job " not in text
    assert "job_finished" not in text
    assert buffers(plan["Plan"]) < 60, buffers(plan["Plan"])
    assert (await reported_counts(pool))[("q", "completed")] == 20_000


async def test_the_count_answers_within_a_timeout_a_full_count_exceeds(pool: asyncpg.Pool) -> None:
    """With 200,000 completed jobs the count completes under a 50 ms statement timeout (a count
    of the rows takes several times that) and reports every one of them."""
    await make_queue(pool, "q")
    await add_finished_jobs(pool, "q", 200_000)
    await pool.execute("ANALYZE jobs.job")
    async with pool.acquire() as conn, conn.transaction(readonly=True):
        await conn.execute("SET LOCAL jit = off")
        await conn.execute("SET LOCAL statement_timeout = 50")
        rows = await db.fetch(conn, SQL.counts)
    counts = {r["name"]: json.loads(r["counts"]) for r in rows}
    assert counts["q"]["completed"] == 200_000


async def test_gauges_are_set_under_a_low_timeout_with_many_finished_jobs(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """queue_jobs and queue_oldest_waiting_seconds are set by a count limited to 100 ms, with
    100,000 finished jobs retained."""
    await make_queue(pool, "gauged")
    await add_finished_jobs(pool, "gauged", 90_000)
    await add_finished_jobs(pool, "gauged", 10_000, state="failed")
    await sender.send("gauged", {})
    await pool.execute("UPDATE jobs.job SET start_after = now() - interval '1 minute'")
    await pool.execute("ANALYZE jobs.job")
    await QueueGauges("jobs", timeout=0.1).refresh(pool)
    assert QUEUE_JOBS.labels("gauged", "completed")._value.get() == 90_000
    assert QUEUE_JOBS.labels("gauged", "failed")._value.get() == 10_000
    assert QUEUE_JOBS.labels("gauged", "created")._value.get() == 1
    assert QUEUE_OLDEST_WAITING.labels("gauged")._value.get() >= 60


class Scenario:
    """A random sequence of everything that moves jobs between states, through the real code
    paths where there are some (sends, timers, claims, outcomes, maintenance) and plain SQL
    for the operator actions of issue 11 and hand-written changes."""

    QUEUES = ("a", "b", "dead")

    def __init__(self, pool: asyncpg.Pool, sender: Sender, rng: random.Random) -> None:
        self.pool = pool
        self.sender = sender
        self.rng = rng
        self.stores = [JobStore(pool, SQL, uuid.uuid4()) for _ in range(2)]
        self.claimed: dict[int, tuple[JobStore, ClaimedJob]] = {}
        self.maintenance = Maintenance(self.stores[0], SQL, "jobs", interval=0, stale_seconds=30)

    async def setup(self) -> None:
        """Queue a retries once then dead-letters; b keeps nothing finished (retention 0)."""
        await make_queue(self.pool, "dead")
        await make_queue(self.pool, "a", retry_limit=1, dead_letter="dead")
        await make_queue(
            self.pool, "b", retry_limit=0, retention_seconds=0, failed_retention_seconds=0
        )

    def queue(self) -> str:
        return self.rng.choice(self.QUEUES)

    def pick_claimed(self) -> tuple[JobStore, list[ClaimedJob]]:
        store = self.rng.choice(self.stores)
        held = [job for s, job in self.claimed.values() if s is store]
        return store, self.rng.sample(held, self.rng.randint(0, len(held)))

    async def forget_lost_claims(self) -> None:
        """Keep only the claims the table still shows active for their owner and attempt."""
        rows = await self.pool.fetch(
            "SELECT id, attempt, locked_by FROM jobs.job WHERE state = 'active'"
        )
        live = {(r["id"], r["attempt"], r["locked_by"]) for r in rows}
        self.claimed = {
            i: (s, j) for i, (s, j) in self.claimed.items() if (i, j.attempt, s.owner) in live
        }

    async def send(self) -> None:
        delay = self.rng.choice([None, 0, 600])
        await self.sender.send(self.queue(), {"k": 1}, start_after=delay)

    async def send_many(self) -> None:
        n = self.rng.randint(1, 15)
        await self.sender.send_many(self.queue(), [{"n": i} for i in range(n)])

    async def claim(self) -> None:
        store = self.rng.choice(self.stores)
        for job in await store.claim(self.queue(), self.rng.randint(1, 8)):
            self.claimed[job.id] = (store, job)

    async def complete(self) -> None:
        store, jobs = self.pick_claimed()
        if self.rng.random() < 0.5:
            await store.complete(jobs)
        else:
            await store.complete_lost(jobs)

    async def complete_and_claim(self) -> None:
        store, jobs = self.pick_claimed()
        if not jobs:
            return
        claimed, _ = await store.complete_and_claim(jobs, jobs[0].queue, self.rng.randint(0, 5))
        for job in claimed:
            self.claimed[job.id] = (store, job)

    async def fail(self) -> None:
        store, jobs = self.pick_claimed()
        await store.fail([(job, "boom") for job in jobs])

    async def hand_back(self) -> None:
        store, jobs = self.pick_claimed()
        await store.hand_back(jobs)

    async def rescue(self) -> None:
        await self.pool.execute(
            "UPDATE jobs.job SET started_at = now() - interval '1 hour' WHERE id IN "
            "(SELECT id FROM jobs.job WHERE state = 'active' ORDER BY random() LIMIT 3)"
        )
        await self.maintenance.run_once(prune=False)

    async def prune(self) -> None:
        await self.pool.execute(
            "UPDATE jobs.job SET completed_at = now() - interval '9 days' WHERE id IN "
            "(SELECT id FROM jobs.job WHERE state > 'active' ORDER BY random() LIMIT 4)"
        )
        await self.maintenance.run_once(prune=True)

    async def timer(self) -> None:
        key = self.rng.choice(["t1", "t2", "t3"])
        delay = self.rng.choice([0.0, 3600.0])
        await self.sender.timers.schedule(self.queue(), delay_seconds=delay, key=key)

    async def cancel_timer(self) -> None:
        await self.sender.timers.cancel(self.queue(), self.rng.choice(["t1", "t2", "t3"]))

    async def retry_finished(self) -> None:
        """Issue 11's retry: failed or cancelled jobs wait again with one more attempt."""
        await self.pool.execute(
            "UPDATE jobs.job SET state = 'retry', start_after = now(), completed_at = NULL,"
            " retry_limit = retry_limit + 1 WHERE id IN (SELECT id FROM jobs.job"
            " WHERE state IN ('failed', 'cancelled') ORDER BY random() LIMIT $1)",
            self.rng.randint(1, 5),
        )

    async def resume(self) -> None:
        await self.pool.execute(
            "UPDATE jobs.job SET state = 'created', completed_at = NULL WHERE id IN"
            " (SELECT id FROM jobs.job WHERE state = 'cancelled' ORDER BY random() LIMIT 3)"
        )

    async def cancel(self) -> None:
        await self.pool.execute(
            "UPDATE jobs.job SET state = 'cancelled', completed_at = now() WHERE id IN"
            " (SELECT id FROM jobs.job WHERE state <= 'active' ORDER BY random() LIMIT $1)",
            self.rng.randint(1, 6),
        )

    async def delete(self) -> None:
        await self.pool.execute(
            "DELETE FROM jobs.job WHERE id IN (SELECT id FROM jobs.job ORDER BY random() LIMIT $1)",
            self.rng.randint(1, 6),
        )

    async def purge(self) -> None:
        await self.pool.execute(
            "DELETE FROM jobs.job WHERE queue = $1 AND state < 'active'", self.queue()
        )

    async def insert_finished(self) -> None:
        await self.pool.execute(
            "INSERT INTO jobs.job (queue, state, retry_limit, retry_delay, retry_backoff,"
            " expire_seconds, completed_at)"
            " SELECT $1, (ARRAY['completed', 'cancelled', 'failed']::jobs.job_state[])"
            "[1 + g % 3], 0, 0, false, 900, now() FROM generate_series(1, $2) g",
            self.queue(),
            self.rng.randint(1, 6),
        )

    async def move_queue(self) -> None:
        await self.pool.execute(
            "UPDATE jobs.job SET queue = $1 WHERE id IN"
            " (SELECT id FROM jobs.job WHERE state > 'active' ORDER BY random() LIMIT 3)",
            self.queue(),
        )

    async def repeatable_read_cancel(self) -> None:
        async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
            await conn.execute(
                "UPDATE jobs.job SET state = 'cancelled', completed_at = now() WHERE id IN"
                " (SELECT id FROM jobs.job WHERE state < 'active' ORDER BY random() LIMIT 2)"
            )

    async def compact(self) -> None:
        await self.pool.fetchval("SELECT jobs.job_count_compact(0)")

    async def concurrently(self) -> None:
        """Three finishing statements at once, on three connections."""
        ops = [self.complete, self.fail, self.cancel, self.delete, self.cancel_timer]
        await asyncio.gather(*(self.rng.choice(ops)() for _ in range(3)))

    def steps(self) -> list[Callable[[], Awaitable[None]]]:
        """Every operation once; sends, claims and outcomes more often, so work gets done."""
        often = [self.send, self.send_many, self.claim, self.claim, self.complete, self.fail]
        once = [self.complete_and_claim, self.hand_back, self.rescue, self.prune, self.timer]
        once += [self.cancel_timer, self.retry_finished, self.resume, self.cancel, self.delete]
        once += [self.purge, self.insert_finished, self.move_queue, self.repeatable_read_cancel]
        once += [self.compact, self.concurrently]
        return often * 2 + once


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_counts_stay_exact_through_every_kind_of_change(
    pool: asyncpg.Pool, sender: Sender, seed: int
) -> None:
    """After each of 80 random steps (sends, timers, claims, completions, failures with retry
    and dead letter, hand-backs, rescues, prunes, operator retries, resumes, cancels, deletes and
    purges, direct inserts, queue moves, a repeatable-read cancel, compaction, concurrent
    statements), the report and the counters equal a GROUP BY count of the table."""
    scenario = Scenario(pool, sender, random.Random(seed))
    await scenario.setup()
    steps = scenario.steps()
    done = []
    most_finished = 0
    for _ in range(80):
        step = scenario.rng.choice(steps)
        await step()
        done.append(step.__name__)
        await scenario.forget_lost_claims()
        try:
            most_finished = max(most_finished, await assert_exact(pool))
        except AssertionError as exc:
            raise AssertionError(f"after steps {done}: {exc}") from None
    assert most_finished > 0, "the scenario finished no job"


async def test_concurrent_finishing_statements_never_wait_and_stay_exact(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """Eight connections completing batches of one queue at once, each inside a transaction
    held open after its statement, all finish (no writer waits for another's counter row) and
    the count is exact."""
    await make_queue(pool, "q")
    await sender.send_many("q", [{} for _ in range(400)])
    stores = [JobStore(pool, SQL, uuid.uuid4()) for _ in range(8)]
    batches = [await store.claim("q", 50) for store in stores]
    entered = 0
    all_in = asyncio.Event()

    async def complete_and_hold(store: JobStore, jobs: list[ClaimedJob]) -> None:
        nonlocal entered
        async with pool.acquire() as conn, conn.transaction():
            # The store's own completion, on this connection (a store only needs .fetch).
            assert await JobStore(conn, SQL, store.owner).complete(jobs) == {j.id for j in jobs}
            entered += 1
            if entered == len(stores):
                all_in.set()
            # Every transaction holds its counter row until all have written theirs.
            await asyncio.wait_for(all_in.wait(), 10)

    await asyncio.wait_for(
        asyncio.gather(*(complete_and_hold(s, b) for s, b in zip(stores, batches, strict=True))),
        20,
    )
    await assert_exact(pool)
    assert (await counter_sums(pool))[("q", "completed")] == 400
    assert await pool.fetchval("SELECT count(*) FROM jobs.job_count") == 8


async def test_a_repeatable_read_cancel_never_fails_on_a_counter_row(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """A REPEATABLE READ transaction that cancels a timer after another session changed the
    cancelled counter row since its snapshot commits without a serialization failure."""
    await make_queue(pool, "q")
    for key in ("first", "theirs", "mine"):
        await sender.timers.schedule("q", delay_seconds=600, key=key)
    assert await sender.timers.cancel("q", "first") is True  # the counter row exists
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
        await conn.fetchval("SELECT count(*) FROM jobs.job")  # takes the snapshot
        assert await sender.timers.cancel("q", "theirs") is True  # updates it meanwhile
        assert await sender.timers.cancel("q", "mine", connection=conn) is True
    await assert_exact(pool)
    assert (await counter_sums(pool))[("q", "cancelled")] == 3


async def test_compaction_folds_rows_and_keeps_every_sum(pool: asyncpg.Pool) -> None:
    """Rows added one per inserted finished job are folded into one per (queue, state), to the
    same sums, leaving keys with few rows alone."""
    await make_queue(pool, "q")
    await make_queue(pool, "r")
    for state in ("completed", "failed"):
        await pool.execute(
            "INSERT INTO jobs.job (queue, state, retry_limit, retry_delay, retry_backoff,"
            " expire_seconds, completed_at)"
            " SELECT 'q', $1::jobs.job_state, 0, 0, false, 900, now()"
            " FROM generate_series(1, 30)",
            state,
        )
    await pool.execute(
        "INSERT INTO jobs.job (queue, state, retry_limit, retry_delay, retry_backoff,"
        " expire_seconds, completed_at) VALUES ('r', 'cancelled', 0, 0, false, 900, now()),"
        " ('r', 'cancelled', 0, 0, false, 900, now())"
    )
    before = await counter_sums(pool)
    assert await pool.fetchval("SELECT count(*) FROM jobs.job_count") == 62
    assert await pool.fetchval("SELECT jobs.job_count_compact(4)") == 58
    assert await counter_sums(pool) == before
    rows = await pool.fetch("SELECT queue, state::text, count(*) FROM jobs.job_count GROUP BY 1, 2")
    assert {(r[0], r[1]): r[2] for r in rows} == {
        ("q", "completed"): 1,
        ("q", "failed"): 1,
        ("r", "cancelled"): 2,
    }
    await assert_exact(pool)


async def test_maintenance_compacts_when_it_prunes(pool: asyncpg.Pool) -> None:
    """A prune pass also folds piled-up counter rows."""
    await make_queue(pool, "q")
    await pool.execute(
        "INSERT INTO jobs.job (queue, state, retry_limit, retry_delay, retry_backoff,"
        " expire_seconds, completed_at)"
        " SELECT 'q', 'completed', 0, 0, false, 900, now() FROM generate_series(1, 40)"
    )
    maintenance = Maintenance(
        JobStore(pool, SQL, uuid.uuid4()), SQL, "jobs", interval=0, stale_seconds=30
    )
    await maintenance.run_once(prune=True)
    assert await pool.fetchval("SELECT count(*) FROM jobs.job_count") == 1
    await assert_exact(pool)


#: Whether another session of the cluster has held, for over a second, a snapshot older than
#: transaction $1: while it does, no row version that died since can be pruned, in any
#: database (the server's visibility horizon is cluster-wide until recomputed).
_HELD_BACK = """
SELECT EXISTS (
    SELECT 1 FROM pg_stat_activity
    WHERE pid <> pg_backend_pid() AND backend_xmin IS NOT NULL
      AND age(backend_xmin) > txid_current() - $1
      AND now() - xact_start > interval '1 second')
"""


async def test_the_counter_table_stays_small_through_many_completions(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """1,000 completions, each its own transaction, leave job_count within four pages without
    VACUUM (three when nothing else runs; with pruning held back it takes seven): every counter
    change is a HOT update that page pruning reclaims. Skipped when another session of the
    shared server held back pruning for over a second meanwhile; the parallel suite's shorter
    snapshots, which the check cannot see, can delay pruning by a page."""
    await make_queue(pool, "q")
    await sender.send_many("q", [{} for _ in range(1000)])
    store = JobStore(pool, SQL, uuid.uuid4())
    start = await pool.fetchval("SELECT txid_current()")
    held_back = False
    for i in range(1000):
        await store.complete(await store.claim("q", 1))
        if i % 25 == 0:
            held_back = held_back or await pool.fetchval(_HELD_BACK, start)
    assert (await counter_sums(pool))[("q", "completed")] == 1000
    if held_back:
        pytest.skip("another session's old snapshot held back pruning during the test")
    assert await pool.fetchval("SELECT pg_relation_size('jobs.job_count')") <= 4 * 8192


async def test_truncate_clears_the_counters(pool: asyncpg.Pool) -> None:
    """TRUNCATE of the job table leaves every count at zero."""
    await make_queue(pool, "q")
    await add_finished_jobs(pool, "q", 10)
    await pool.execute("TRUNCATE jobs.job")
    assert await counter_sums(pool) == {}
    await assert_exact(pool)


async def test_reset_recounts_exactly(pool: asyncpg.Pool) -> None:
    """job_count_reset replaces counters edited by hand with the table's own counts."""
    await make_queue(pool, "q")
    await add_finished_jobs(pool, "q", 25, state="cancelled")
    await pool.execute("UPDATE jobs.job_count SET n = n + 1000")
    assert await pool.fetchval("SELECT jobs.job_count_reset()") == 25
    await assert_exact(pool)


async def test_the_migration_counts_the_jobs_a_database_already_holds(
    empty_db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database migrated before the counters existed, holding jobs in every state, gets
    counters equal to its table when migration 0005 runs."""
    older = tmp_path / "migrations"
    older.mkdir()
    for path in sorted(migrations.migrations_dir().glob("*.sql")):
        if path.name < "0005":
            (older / path.name).write_text(path.read_text())
    conn = await asyncpg.connect(empty_db_url)
    try:
        with monkeypatch.context() as patched:
            patched.setattr(migrations, "migrations_dir", lambda: older)
            await migrations.migrate(conn, "jobs", lock_timeout=10)
        assert await conn.fetchval("SELECT to_regclass('jobs.job_count')") is None
        await conn.execute("INSERT INTO jobs.queue (name) VALUES ('q'), ('r')")
        await conn.execute(
            "INSERT INTO jobs.job (queue, state, retry_limit, retry_delay, retry_backoff,"
            " expire_seconds, completed_at)"
            " SELECT (ARRAY['q', 'r'])[1 + g % 2], (enum_range(NULL::jobs.job_state))[1 + g % 6],"
            " 0, 0, false, 900, now() FROM generate_series(1, 600) g"
        )
        assert await migrations.migrate(conn, "jobs", lock_timeout=10) == list(
            range(5, migrations.latest_version() + 1)
        )
        assert await counter_sums(conn) == await finished_table_counts(conn)
        assert await reported_counts(conn) == await table_counts(conn)
    finally:
        await conn.close()
