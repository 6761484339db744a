"""Drill 9: a hypothesis state machine over the queue's writes against the real database."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
import structlog
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from api_sender import Sender
from tests.drills.helpers import SCALE, sized
from tests.support.queues import make_queue
from worker.queue.heartbeat import Heartbeat
from worker.queue.holdings import Holdings
from worker.queue.jobs import ClaimedJob, claim_token
from worker.queue.maintenance import Maintenance
from worker.queue.sql import render
from worker.queue.store import JobStore

#: In-process, on one small pool: it needs no turn among the multi-process drills.
pytestmark = [pytest.mark.drill]

SQL = render("jobs")
# Model time moves in large steps so that the real milliseconds between two statements never
# decide a comparison: an age equal to a limit is past it (the real clock moved on a little).
STALE = 10_000
EXPIRE = 30_000
RETRY_DELAY = 5_000
RETRY_LIMIT = 2
PENDING = ("created", "retry")
#: What a timer replace or cancel ends: a timer that has not finished, waiting or running.
UNFINISHED = (*PENDING, "active")
TERMINAL = ("completed", "cancelled", "failed")


@dataclass
class Job:
    """What the model expects of one job."""

    id: int
    priority: int
    state: str = "created"
    attempt: int = 0
    retry_count: int = 0
    owner: uuid.UUID | None = None
    #: Model time at which it is due, and the step that set it (ties: the earlier write).
    due: int = 0
    due_step: int = 0
    started: int = 0
    key: str | None = None


class Harness:
    """The event loop, pool and counters shared by every example of one test run."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.runner = asyncio.Runner()
        self.pool: asyncpg.Pool = self.run(self._open(url))
        self.examples = 0
        self.steps = 0
        self.refused = 0
        self.transitions: dict[str, int] = {}

    @staticmethod
    async def _open(url: str) -> asyncpg.Pool:
        return await asyncpg.create_pool(url, min_size=1, max_size=2)

    def run(self, coro: Any) -> Any:
        """Run ``coro`` to completion on the harness's loop."""
        return self.runner.run(coro)

    def close(self) -> None:
        """Close the pool and the loop."""
        self.run(self.pool.close())
        self.runner.close()


class QueueMachine(RuleBasedStateMachine):
    """Enqueue, timers, claim, complete, fail, hand back, heartbeat, rescue, cancel and the
    passing of time, checked against a model after every step."""

    harness: Harness
    claims = Bundle("claims")

    def __init__(self) -> None:
        super().__init__()
        h = self.harness
        h.examples += 1
        self.queue = f"sm-{uuid.uuid4().hex[:12]}"
        self.owners = [uuid.uuid4(), uuid.uuid4()]
        self.stores = [JobStore(h.pool, SQL, owner) for owner in self.owners]
        self.sender = Sender(h.pool)
        self.maintenance = Maintenance(
            JobStore(h.pool, SQL, uuid.uuid4()), SQL, "jobs", interval=1, stale_seconds=STALE
        )
        self.beats = [
            Heartbeat(h.pool, SQL, owner, Holdings(), interval=1) for owner in self.owners
        ]
        self.jobs: dict[int, Job] = {}
        self.clock = 0
        self.step = 0
        self.beat_at: dict[uuid.UUID, int] = {}
        self.seen_attempt: dict[int, int] = {}
        self.seen_terminal: dict[int, str] = {}
        #: Every claim handed out: its claim instant moves with the database's when time passes.
        self.handed_out: list[ClaimedJob] = []
        h.run(
            make_queue(
                h.pool,
                self.queue,
                retry_limit=RETRY_LIMIT,
                retry_delay=RETRY_DELAY,
                retry_backoff=True,
                expire_seconds=EXPIRE,
            )
        )

    def _tick(self, what: str) -> None:
        self.step += 1
        self.harness.steps += 1
        self.harness.transitions[what] = self.harness.transitions.get(what, 0) + 1

    def _fenced(self, worker: int, claimed: ClaimedJob) -> bool:
        job = self.jobs[claimed.id]
        return (
            job.state == "active"
            and job.owner == self.owners[worker]
            and job.attempt == claimed.attempt
        )

    def _stale(self, worker: int, claimed: ClaimedJob) -> bool:
        """Whether a write on this claim should land; counts the ones that must not."""
        fenced = self._fenced(worker, claimed)
        if not fenced:
            self.harness.refused += 1
        return fenced

    def _failed(self, job: Job) -> None:
        if job.retry_count < RETRY_LIMIT:
            job.state = "retry"
            job.due = self.clock + RETRY_DELAY * 2**job.retry_count
            job.due_step = self.step
        else:
            job.state = "failed"
        job.retry_count += 1

    @initialize(priorities=st.lists(st.sampled_from([0, 1, 5]), min_size=1, max_size=6))
    def seed(self, priorities: list[int]) -> None:
        """Start with a few due jobs."""
        for priority in priorities:
            self.enqueue(0, priority)

    @rule(delay=st.sampled_from([0, 0, 20_000]), priority=st.sampled_from([0, 1, 5]))
    def enqueue(self, delay: int, priority: int) -> None:
        """Send one job, due now or later."""
        self._tick("enqueue")
        job_id = self.harness.run(
            self.sender.send(self.queue, {}, start_after=delay, priority=priority)
        )
        assert job_id is not None
        self.jobs[job_id] = Job(job_id, priority, due=self.clock + delay, due_step=self.step)

    @rule(key=st.sampled_from(["a", "b"]), delay=st.sampled_from([0, 20_000]))
    def timer(self, key: str, delay: int) -> None:
        """Schedule a keyed timer: the unfinished one with that key (waiting or running) is
        cancelled."""
        self._tick("timer")
        job_id = self.harness.run(
            self.sender.timers.schedule(self.queue, delay_seconds=delay, data={}, key=key)
        )
        for job in self.jobs.values():
            if job.key == key and job.state in UNFINISHED:
                job.state = "cancelled"
        self.jobs[job_id] = Job(job_id, 0, due=self.clock + delay, due_step=self.step, key=key)

    @rule(key=st.sampled_from(["a", "b"]))
    def cancel(self, key: str) -> None:
        """Cancel the unfinished timer of a key (waiting or running), if any."""
        self._tick("cancel")
        cancelled = self.harness.run(self.sender.timers.cancel(self.queue, key))
        pending = [j for j in self.jobs.values() if j.key == key and j.state in UNFINISHED]
        assert cancelled == bool(pending)
        for job in pending:
            job.state = "cancelled"

    @rule(target=claims, worker=st.integers(0, 1), limit=st.integers(1, 3))
    def claim(self, worker: int, limit: int) -> Any:
        """Claim due jobs: exactly the first ``limit`` in priority, then due, order."""
        self._tick("claim")
        got = self.harness.run(self.stores[worker].claim(self.queue, limit))
        eligible = sorted(
            (j for j in self.jobs.values() if j.state in PENDING and j.due <= self.clock),
            key=lambda j: (-j.priority, j.due, j.due_step, j.id),
        )
        expected = [j.id for j in eligible[:limit]]
        assert sorted(c.id for c in got) == sorted(expected)
        self.handed_out.extend(got)
        for claimed in got:
            job = self.jobs[claimed.id]
            job.state = "active"
            job.owner = self.owners[worker]
            job.attempt += 1
            job.started = self.clock
            assert claimed.attempt == job.attempt
        return multiple(*((worker, c) for c in got))

    @rule(claim=claims)
    def complete(self, claim: tuple[int, ClaimedJob]) -> None:
        """Complete a (maybe stale) claim: it lands only while the fence holds."""
        self._tick("complete")
        worker, claimed = claim
        fenced = self._stale(worker, claimed)
        matched = self.harness.run(self.stores[worker].complete([claimed]))
        assert (claimed.id in matched) == fenced
        if fenced:
            self.jobs[claimed.id].state = "completed"

    @rule(claim=claims)
    def fail(self, claim: tuple[int, ClaimedJob]) -> None:
        """Fail a (maybe stale) claim: retry below the limit, failed at it."""
        self._tick("fail")
        worker, claimed = claim
        fenced = self._stale(worker, claimed)
        outcomes = self.harness.run(self.stores[worker].fail([(claimed, "boom")]))
        assert bool(outcomes) == fenced
        if fenced:
            job = self.jobs[claimed.id]
            self._failed(job)
            assert outcomes[0].state == job.state

    @rule(claim=claims)
    def hand_back(self, claim: tuple[int, ClaimedJob]) -> None:
        """Hand a (maybe stale) claim back: due at once, no attempt lost."""
        self._tick("hand_back")
        worker, claimed = claim
        fenced = self._stale(worker, claimed)
        matched = self.harness.run(self.stores[worker].hand_back([claimed]))
        assert (claimed.id in matched) == fenced
        if fenced:
            job = self.jobs[claimed.id]
            job.state = "retry"
            job.owner = None
            job.due = self.clock
            job.due_step = self.step

    @rule(worker=st.integers(0, 1))
    def heartbeat(self, worker: int) -> None:
        """A worker beats."""
        self._tick("heartbeat")
        self.harness.run(self.beats[worker].beat())
        self.beat_at[self.owners[worker]] = self.clock

    @rule()
    def rescue(self) -> None:
        """Maintenance fails exactly the active jobs of silent workers and expired ones."""
        self._tick("rescue")
        due = []
        for job in self.jobs.values():
            if job.state != "active":
                continue
            age = self.clock - job.started
            assert job.owner is not None
            beat = self.beat_at.get(job.owner)
            silent = beat is None or self.clock - beat >= STALE
            if age >= EXPIRE or (age >= STALE and silent):
                due.append(job)
        rescued, _ = self.harness.run(self.maintenance.run_once(prune=False))
        assert rescued == len(due)
        for job in due:
            self._failed(job)

    @rule(seconds=st.sampled_from([2_000, 5_000, 10_000]))
    def advance(self, seconds: int) -> None:
        """Time passes: every timestamp of this queue and its workers moves into the past."""
        self._tick("advance")
        self.clock += seconds
        self.harness.run(self._shift(seconds))

    async def _shift(self, seconds: int) -> None:
        # A claim is fenced on its instant (started_at) too: the workers' copies move with it.
        for claimed in self.handed_out:
            claimed.claim = claim_token(claimed.started_at - timedelta(seconds=seconds))
        pool = self.harness.pool
        await pool.execute(
            "UPDATE jobs.job SET start_after = start_after - make_interval(secs => $2),"
            " created_at = created_at - make_interval(secs => $2),"
            " started_at = started_at - make_interval(secs => $2),"
            " completed_at = completed_at - make_interval(secs => $2) WHERE queue = $1",
            self.queue,
            seconds,
        )
        await pool.execute(
            "UPDATE jobs.worker SET heartbeat_at = heartbeat_at - make_interval(secs => $2)"
            " WHERE id = ANY($1::uuid[])",
            self.owners,
            seconds,
        )

    @invariant()
    def database_matches_the_model(self) -> None:
        """One state per job as the model says; active implies an owner; terminal stays put;
        attempts never go back."""
        rows = self.harness.run(
            self.harness.pool.fetch(
                "SELECT id, state::text AS state, attempt, retry_count, locked_by, started_at"
                " FROM jobs.job WHERE queue = $1",
                self.queue,
            )
        )
        assert {r["id"] for r in rows} == set(self.jobs)
        for row in rows:
            job = self.jobs[row["id"]]
            assert (row["state"], row["attempt"], row["retry_count"]) == (
                job.state,
                job.attempt,
                job.retry_count,
            ), f"job {job.id}: database {dict(row)} vs model {job}"
            if row["state"] == "active":
                assert row["locked_by"] == job.owner
                assert row["started_at"] is not None
            assert row["attempt"] >= self.seen_attempt.get(row["id"], 0)
            self.seen_attempt[row["id"]] = row["attempt"]
            if row["id"] in self.seen_terminal:
                assert row["state"] == self.seen_terminal[row["id"]], "a terminal job moved"
            if row["state"] in TERMINAL:
                self.seen_terminal[row["id"]] = row["state"]
            assert row["retry_count"] <= RETRY_LIMIT + 1

    def teardown(self) -> None:
        """Remove this example's jobs and workers so rescues of later examples see none."""
        pool = self.harness.pool
        self.harness.run(pool.execute("DELETE FROM jobs.job WHERE queue = $1", self.queue))
        self.harness.run(
            pool.execute("DELETE FROM jobs.worker WHERE id = ANY($1::uuid[])", self.owners)
        )


def test_queue_state_machine_holds_its_invariants(db_url: str, drill_report) -> None:
    """Random interleavings of enqueue, timers, claim, complete, fail, hand-back, heartbeat,
    rescue, cancel and time passing keep the database equal to the model: one state per job,
    active implies an owner, terminal jobs are never claimed again, attempts never go back,
    and a write on a lost claim changes nothing."""
    harness = Harness(db_url)
    QueueMachine.harness = harness
    examples = sized(60, 500)
    try:
        with structlog.testing.capture_logs():
            run_state_machine_as_test(
                QueueMachine,
                settings=settings(
                    max_examples=examples,
                    stateful_step_count=sized(30, 60),
                    deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
                    database=None,
                ),
            )
    finally:
        harness.close()
    counts = ", ".join(f"{k} {v}" for k, v in sorted(harness.transitions.items()))
    drill_report(
        f"drill 9 state machine [{SCALE}: {harness.examples} examples, {harness.steps} steps"
        f" against PostgreSQL]: database equal to the model after every step ({counts});"
        " one state per job, active implies owner, terminal never re-claimed, attempts"
        f" monotonic, {harness.refused} writes on lost claims matched 0 rows"
    )
