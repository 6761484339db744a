"""A runner's cancel scope after a handler that outlived its cancel or its expiry (its work in a
thread, which neither stops): the next job the runner takes runs in a fresh scope, and no cancel
is left pending (issue 28, item 13)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence

import anyio
import anyio.to_thread
import asyncpg
import pytest

from api_sender import Sender
from tests.queue.test_poller import SQL, states
from tests.support.queues import make_queue
from worker.queue.completer import Completer
from worker.queue.holdings import Holdings
from worker.queue.jobs import ClaimedJob
from worker.queue.poller import Consumer, Poller
from worker.queue.store import JobStore


class _Release:
    """Lets the thread-bound handler return just as a claim brings the next jobs: the handler's
    wake-up is then queued on the event loop before the idle runners', so its runner takes one of
    those jobs straight from the queue, with no await between the two jobs (what a busy worker
    does all the time; made certain here)."""

    def __init__(self) -> None:
        self.thread = threading.Event()

    def landed(self, jobs: Sequence[ClaimedJob]) -> None:
        if any(job.raw_data is not None and "next" in job.raw_data for job in jobs):
            self.thread.set()
            # Blocks the loop until the thread has ended and queued its result.
            time.sleep(0.1)


def releasing_store(release: _Release) -> type[JobStore]:
    """A JobStore whose claims call ``release.landed`` with the jobs they took."""

    class Store(JobStore):
        async def claim(
            self, queue: str, limit: int, *, one_per_key: bool = False
        ) -> list[ClaimedJob]:
            jobs = await super().claim(queue, limit, one_per_key=one_per_key)
            release.landed(jobs)
            return jobs

        async def complete_and_claim(
            self, done: Sequence[ClaimedJob], queue: str, limit: int, *, lazy: bool = False
        ) -> tuple[list[ClaimedJob], set[int]]:
            jobs, lost = await super().complete_and_claim(done, queue, limit, lazy=lazy)
            release.landed(jobs)
            return jobs, lost

    return Store


async def settled(pool: asyncpg.Pool, ids: Sequence[int], *wanted: str) -> bool:
    """Whether every job of ``ids`` is in one of the ``wanted`` states."""
    current = await states(pool)
    return all(current[i][0] in wanted for i in ids)


@pytest.mark.parametrize("cause", ["cancel", "expiry"])
async def test_a_handler_outliving_its_cancel_leaves_the_next_job_of_its_runner_alone(
    pool: asyncpg.Pool, sender: Sender, cause: str
) -> None:
    """A running job is cancelled (or passes its expiry) while its handler waits on a thread,
    and the handler then returns normally: a cancelled job is dropped (its row stays cancelled),
    an expired one keeps its outcome; either way the jobs its runner takes next complete, none
    is failed as expired, and no cancel is left pending."""
    expire = 1 if cause == "expiry" else 30
    await make_queue(pool, "q", retry_limit=0, expire_seconds=expire)
    release = _Release()
    store = releasing_store(release)(pool, SQL, uuid.uuid4())
    holdings = Holdings()
    completer = Completer(store, holdings)
    running: dict[int, ClaimedJob] = {}
    started = anyio.Event()

    async def handler(job: ClaimedJob) -> None:
        if job.data.get("thread"):
            running[job.id] = job
            started.set()
            await anyio.to_thread.run_sync(release.thread.wait, 20)
        else:
            await anyio.sleep(0)

    # Three runners: the thread-bound job's, and two idle ones for the next claim to wake.
    poller = Poller(
        Consumer("q", batch_size=3, concurrency=3, run_job=handler), store, completer, holdings
    )
    [first, *warm] = await sender.send_many("q", [{"thread": True}, {"n": 1}, {"n": 2}])
    async with anyio.create_task_group() as tg:
        tg.start_soon(completer.run)
        tg.start_soon(poller.run)
        poller.waker.wake()
        with anyio.fail_after(10):
            await started.wait()
            while not await settled(pool, warm, "completed"):
                await anyio.sleep(0.05)
        if cause == "cancel":
            await pool.execute(
                "UPDATE jobs.job SET state = 'cancelled', completed_at = now() WHERE id = $1",
                first,
            )
            assert poller.interrupt([running[first]]) == [first]
        else:
            await anyio.sleep(expire + 0.3)
        later = await sender.send_many("q", [{"next": n} for n in range(2)])
        with anyio.fail_after(10):
            while not await settled(pool, [first, *later], "cancelled", "completed", "failed"):
                poller.waker.wake()
                await anyio.sleep(0.05)
        poller.stop()
        await poller.stopped.wait()
        await completer.drain()
        tg.cancel_scope.cancel()
    result = await states(pool)
    assert result[first][0] == ("cancelled" if cause == "cancel" else "completed")
    assert {i: result[i] for i in later} == {i: ("completed", None) for i in later}
    assert not poller._cancelled, "a cancel was left pending"
