"""One queue's consumer: a fetcher that claims batches and ``concurrency`` runners."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import anyio
import structlog
from anyio.abc import ObjectReceiveStream, ObjectSendStream

from ..db.connections import TRANSIENT_ERRORS, backoff_delay
from ..metrics import JOB_DURATION
from .completer import Completer
from .holdings import Holdings
from .jobs import ClaimedJob
from .store import JobStore
from .waker import Waker

log = structlog.get_logger("worker.queue")

#: Runs one job; raising fails that job.
JobRunner = Callable[[ClaimedJob], Awaitable[object]]
#: Runs a whole batch; raising fails every job of it, a returned mapping fails those job ids
#: (with the given error text) and completes the rest.
BatchRunner = Callable[[list[ClaimedJob]], Awaitable[Mapping[int, str] | None]]

Work = ClaimedJob | list[ClaimedJob]


@dataclass(frozen=True, slots=True)
class Consumer:
    """What to run for one queue and how wide."""

    queue: str
    batch_size: int = 1
    concurrency: int = 1
    run_job: JobRunner | None = None
    run_batch: BatchRunner | None = None
    #: singleton/stately queues: never two active jobs of one key.
    one_per_key: bool = False

    def __post_init__(self) -> None:
        if (self.run_job is None) == (self.run_batch is None):
            raise ValueError(f"consumer {self.queue!r} needs exactly one of run_job, run_batch")


class Poller:
    """Claims jobs of one queue when woken and runs them; stops cleanly on request.

    At most ``max(batch_size, concurrency)`` jobs (batches: ``concurrency`` batches) are held at
    once, so one process never hoards work other replicas could run.
    """

    def __init__(
        self,
        consumer: Consumer,
        store: JobStore,
        completer: Completer,
        holdings: Holdings,
    ) -> None:
        self.consumer = consumer
        self.waker = Waker()
        self._store = store
        self._completer = completer
        self._holdings = holdings
        self._capacity = Waker()
        self._stopping = False
        self._inflight = 0
        self._running: set[anyio.CancelScope] = set()
        if consumer.run_batch is not None:
            self._limit = consumer.batch_size * consumer.concurrency
        else:
            self._limit = max(consumer.batch_size, consumer.concurrency)
        # Claim again once at least half a batch of room is free, not one slot at a time.
        self._threshold = max(1, min(consumer.batch_size, self._limit) // 2)
        self.stopped = anyio.Event()

    @property
    def queue(self) -> str:
        """The queue this poller consumes."""
        return self.consumer.queue

    def stop(self) -> None:
        """Stop claiming; jobs already claimed but not started are handed back."""
        self._stopping = True
        self.waker.wake()
        self._capacity.wake()

    def cancel_running(self) -> None:
        """Interrupt running handlers (grace exceeded); their jobs are handed back."""
        for scope in list(self._running):
            scope.cancel()

    async def run(self) -> None:
        """Fetch and run until stopped and every claimed job has an outcome."""
        send, receive = anyio.create_memory_object_stream[Work](max_buffer_size=self._limit)
        try:
            async with anyio.create_task_group() as tg:
                for _ in range(self.consumer.concurrency):
                    tg.start_soon(self._runner, receive.clone())
                receive.close()
                await self._fetcher(send)
        finally:
            self.stopped.set()

    async def _fetcher(self, send: ObjectSendStream[Work]) -> None:
        consumer = self.consumer
        attempt = 0
        async with send:
            while not self._stopping:
                generation = self.waker.generation
                free = self._limit - self._inflight
                if free < self._threshold and self._inflight > 0:
                    await self._capacity.wait_since(self._capacity.generation)
                    continue
                want = min(consumer.batch_size, free)
                try:
                    jobs = await self._store.claim(
                        consumer.queue, want, one_per_key=consumer.one_per_key
                    )
                    attempt = 0
                except TRANSIENT_ERRORS as exc:
                    delay = backoff_delay(attempt)
                    attempt += 1
                    log.warning(
                        "poller.claim_failed",
                        queue=consumer.queue,
                        error=f"{type(exc).__name__}: {exc}",
                        retry_in=round(delay, 2),
                    )
                    await anyio.sleep(delay)
                    continue
                if jobs:
                    self._holdings.add(len(jobs))
                    self._inflight += len(jobs)
                    if consumer.run_batch is not None:
                        await send.send(jobs)
                    else:
                        for job in jobs:
                            await send.send(job)
                if len(jobs) < want:
                    await self.waker.wait_since(generation)

    async def _runner(self, receive: ObjectReceiveStream[Work]) -> None:
        async with receive:
            async for work in receive:
                batch = work if isinstance(work, list) else [work]
                try:
                    if self._stopping:
                        for job in batch:
                            self._completer.handed_back(job)
                    elif isinstance(work, list):
                        await self._run_batch(work)
                    else:
                        await self._run_one(work)
                finally:
                    self._inflight -= len(batch)
                    self._capacity.wake()

    async def _run_one(self, job: ClaimedJob) -> None:
        run_job = self.consumer.run_job
        assert run_job is not None
        started = time.perf_counter()
        with anyio.CancelScope() as scope:
            self._running.add(scope)
            try:
                with structlog.contextvars.bound_contextvars(
                    job_id=job.id, queue=job.queue, attempt=job.attempt
                ):
                    with anyio.fail_after(job.expire_seconds):
                        await run_job(job)
                self._completer.succeeded(job)
            except TimeoutError:
                self._completer.failed(job, f"expired: ran past {job.expire_seconds}s")
            except Exception as exc:
                self._completer.failed(job, f"{type(exc).__name__}: {exc}")
            finally:
                self._running.discard(scope)
        if scope.cancelled_caught:
            self._completer.handed_back(job)
        JOB_DURATION.labels(job.queue).observe(time.perf_counter() - started)

    async def _run_batch(self, jobs: list[ClaimedJob]) -> None:
        run_batch = self.consumer.run_batch
        assert run_batch is not None
        expire = min(job.expire_seconds for job in jobs)
        started = time.perf_counter()
        with anyio.CancelScope() as scope:
            self._running.add(scope)
            try:
                with structlog.contextvars.bound_contextvars(queue=self.queue, batch=len(jobs)):
                    with anyio.fail_after(expire):
                        failures = await run_batch(jobs)
                failures = failures or {}
                for job in jobs:
                    error = failures.get(job.id)
                    if error is None:
                        self._completer.succeeded(job)
                    else:
                        self._completer.failed(job, error)
            except TimeoutError:
                for job in jobs:
                    self._completer.failed(job, f"expired: batch ran past {expire}s")
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                for job in jobs:
                    self._completer.failed(job, error)
            finally:
                self._running.discard(scope)
        if scope.cancelled_caught:
            for job in jobs:
                self._completer.handed_back(job)
        JOB_DURATION.labels(self.queue).observe(time.perf_counter() - started)
