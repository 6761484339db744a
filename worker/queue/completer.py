"""Outcomes of handlers, written to the database in batches by one task per process."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import anyio
import structlog

from ..db.connections import TRANSIENT_ERRORS, backoff_delay
from ..metrics import JOBS_COMPLETED, JOBS_FAILED, JOBS_HANDED_BACK, JOBS_LEASE_LOST
from .holdings import Holdings
from .jobs import ClaimedJob
from .store import FailOutcome, JobStore

log = structlog.get_logger("worker.queue")

#: A non-transient write error is retried this many times before the outcomes are given up
#: (the jobs are then rescued as a dead worker's would be: at least once still holds).
_MAX_HARD_FAILURES = 5


class Completer:
    """Buffers outcomes and flushes them: one complete, one fail, one hand-back statement per
    flush, however many handlers finished meanwhile. A job is done only when its flush commits."""

    def __init__(self, store: JobStore, holdings: Holdings) -> None:
        self._store = store
        self._holdings = holdings
        self._done: list[ClaimedJob] = []
        self._failed: list[tuple[ClaimedJob, str]] = []
        self._back: list[ClaimedJob] = []
        self._pending = anyio.Event()
        # Held while a flush runs, so a drain at shutdown waits for the one in progress.
        self._lock = anyio.Lock()

    def succeeded(self, job: ClaimedJob) -> None:
        """Record that ``job``'s handler returned."""
        self._done.append(job)
        self._signal()

    def succeeded_many(self, jobs: Iterable[ClaimedJob]) -> None:
        """Record that a batch handler returned for all of ``jobs``."""
        self._done.extend(jobs)
        self._signal()

    def failed(self, job: ClaimedJob, error: str) -> None:
        """Record a failed attempt of ``job``."""
        self._failed.append((job, error.replace("\x00", "")))
        self._signal()

    def handed_back(self, job: ClaimedJob) -> None:
        """Record that ``job`` was claimed but will not run here (shutdown)."""
        self._back.append(job)
        self._signal()

    def _signal(self) -> None:
        self._pending.set()

    @property
    def has_pending(self) -> bool:
        """Whether outcomes wait to be written."""
        return bool(self._done or self._failed or self._back)

    async def run(self) -> None:
        """Flush outcomes as they come, until cancelled."""
        while True:
            await self._pending.wait()
            self._pending = anyio.Event()
            async with self._lock:
                await self.flush()

    async def drain(self) -> None:
        """Write everything buffered, after any flush in progress (used at shutdown)."""
        async with self._lock:
            while self.has_pending:
                await self.flush()

    async def flush(self) -> None:
        """Write the buffered outcomes, retrying transient database errors with backoff."""
        done, failed, back = self._done, self._failed, self._back
        self._done, self._failed, self._back = [], [], []
        hard_failures = 0
        attempt = 0
        while done or failed or back:
            try:
                if done:
                    self._settle_completed(done, await self._store.complete(done))
                    done = []
                if failed:
                    self._settle_failed(failed, await self._store.fail(failed))
                    failed = []
                if back:
                    self._settle_back(back, await self._store.hand_back(back))
                    back = []
            except TRANSIENT_ERRORS as exc:
                delay = backoff_delay(attempt)
                attempt += 1
                log.warning(
                    "job.outcome_write_retry",
                    error=f"{type(exc).__name__}: {exc}",
                    pending=len(done) + len(failed) + len(back),
                    retry_in=round(delay, 2),
                )
                await anyio.sleep(delay)
            except Exception as exc:
                hard_failures += 1
                log.error(
                    "job.outcome_write_failed",
                    error=f"{type(exc).__name__}: {exc}",
                    pending=len(done) + len(failed) + len(back),
                    tries=hard_failures,
                )
                if hard_failures >= _MAX_HARD_FAILURES:
                    given_up = len(done) + len(failed) + len(back)
                    self._holdings.remove(given_up)
                    log.error(
                        "job.outcome_given_up",
                        jobs=given_up,
                        ids=[j.id for j in done] + [j.id for j, _ in failed] + [j.id for j in back],
                    )
                    break
                await anyio.sleep(backoff_delay(hard_failures))

    def _settle_completed(self, jobs: list[ClaimedJob], matched: set[int]) -> None:
        per_queue: Counter[str] = Counter()
        for job in jobs:
            if job.id in matched:
                per_queue[job.queue] += 1
            else:
                self._lease_lost(job, "complete")
        for queue, n in per_queue.items():
            JOBS_COMPLETED.labels(queue).inc(n)
        self._holdings.remove(len(jobs))

    def _settle_failed(
        self, failures: list[tuple[ClaimedJob, str]], outcomes: list[FailOutcome]
    ) -> None:
        states = {o.id: o.state for o in outcomes}
        per_queue: Counter[str] = Counter()
        for job, error in failures:
            state = states.get(job.id)
            if state is None:
                self._lease_lost(job, "fail")
                continue
            per_queue[job.queue] += 1
            log.warning(
                "job.failed",
                job_id=job.id,
                queue=job.queue,
                attempt=job.attempt,
                next_state=state,
                error=error[:500],
            )
        for queue, n in per_queue.items():
            JOBS_FAILED.labels(queue).inc(n)
        self._holdings.remove(len(failures))

    def _settle_back(self, jobs: list[ClaimedJob], matched: set[int]) -> None:
        for job in jobs:
            if job.id in matched:
                JOBS_HANDED_BACK.labels(job.queue).inc()
                log.info("job.handed_back", job_id=job.id, queue=job.queue, attempt=job.attempt)
            else:
                self._lease_lost(job, "hand_back")
        self._holdings.remove(len(jobs))

    @staticmethod
    def _lease_lost(job: ClaimedJob, write: str) -> None:
        JOBS_LEASE_LOST.labels(job.queue).inc()
        log.warning(
            "job.lease_lost",
            job_id=job.id,
            queue=job.queue,
            attempt=job.attempt,
            write=write,
            hint="the job was rescued or expired; this result is dropped",
        )
