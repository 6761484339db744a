"""Outcomes of handlers, written to the database in batches by one task per process."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

import anyio
import anyio.lowlevel
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
    flush, however many handlers finished meanwhile. A job is done only when its flush commits.

    A poller about to claim may take the buffered successes instead (:meth:`take_done`) and
    write them in its claim statement; either way each outcome is written exactly once, and the
    poller whose job it was hears of it (:meth:`watch`) only once it is written.
    """

    def __init__(self, store: JobStore, holdings: Holdings) -> None:
        self._store = store
        self._holdings = holdings
        self._done: list[ClaimedJob] = []
        self._failed: list[tuple[ClaimedJob, str]] = []
        self._back: list[ClaimedJob] = []
        self._pending = anyio.Event()
        # Held while a flush runs, so a drain at shutdown waits for the one in progress.
        self._lock = anyio.Lock()
        self._watchers: dict[str, Callable[[int], None]] = {}
        self._untaken: Counter[str] = Counter()

    def watch(self, queue: str, settled: Callable[[int], None]) -> None:
        """Call ``settled(n)`` whenever ``n`` outcomes of ``queue`` are written (or given up)."""
        self._watchers[queue] = settled

    def take_done(self) -> list[ClaimedJob]:
        """Hand the buffered successes to a caller that writes them itself (then
        :meth:`settle_done`, or :meth:`restore_done` if its write failed)."""
        return self._take()

    def settle_done(self, jobs: list[ClaimedJob], lost: Iterable[int]) -> None:
        """``jobs`` were written as completed, except the ids in ``lost`` (lease lost)."""
        if jobs:
            self._settle_completed(jobs, lost)

    def restore_done(self, jobs: list[ClaimedJob]) -> None:
        """Take back successes whose write failed; they go out with the next flush."""
        if jobs:
            self._done[:0] = jobs
            self._untaken.update(job.queue for job in jobs)
            self._signal()

    def succeeded(self, job: ClaimedJob) -> None:
        """Record that ``job``'s handler returned."""
        self._done.append(job)
        self._untaken[job.queue] += 1
        self._signal()

    def succeeded_many(self, jobs: Iterable[ClaimedJob]) -> None:
        """Record that a batch handler returned for all of ``jobs``."""
        for job in jobs:
            self._done.append(job)
            self._untaken[job.queue] += 1
        self._signal()

    def untaken(self, queue: str) -> int:
        """How many successes of ``queue`` wait to be written and are not yet being written."""
        return self._untaken[queue]

    def _take(self) -> list[ClaimedJob]:
        done, self._done = self._done, []
        self._untaken.clear()
        return done

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
            # Yield once: a fetcher woken by the same handlers claims next and takes the
            # successes into its claim statement (one round trip and one commit fewer).
            await anyio.lowlevel.checkpoint()
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
        done, failed, back = self._take(), self._failed, self._back
        self._failed, self._back = [], []
        hard_failures = 0
        attempt = 0
        while done or failed or back:
            try:
                if done:
                    self._settle_completed(done, await self._store.complete_lost(done))
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
                    self._release(
                        Counter(j.queue for j in done)
                        + Counter(j.queue for j, _ in failed)
                        + Counter(j.queue for j in back)
                    )
                    log.error(
                        "job.outcome_given_up",
                        jobs=given_up,
                        ids=[j.id for j in done] + [j.id for j, _ in failed] + [j.id for j in back],
                    )
                    break
                await anyio.sleep(backoff_delay(hard_failures))

    def _release(self, per_queue: Counter[str]) -> None:
        for queue, n in per_queue.items():
            settled = self._watchers.get(queue)
            if settled is not None:
                settled(n)

    def _settle_completed(self, jobs: list[ClaimedJob], lost: Iterable[int]) -> None:
        lost = set(lost)
        per_queue = Counter(job.queue for job in jobs)
        matched = per_queue.copy()
        if lost:
            for job in jobs:
                if job.id in lost:
                    matched[job.queue] -= 1
                    self._lease_lost(job, "complete")
        for queue, n in matched.items():
            if n:
                JOBS_COMPLETED.labels(queue).inc(n)
        self._holdings.remove(len(jobs))
        self._release(per_queue)

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
        self._release(Counter(job.queue for job, _ in failures))

    def _settle_back(self, jobs: list[ClaimedJob], matched: set[int]) -> None:
        for job in jobs:
            if job.id in matched:
                JOBS_HANDED_BACK.labels(job.queue).inc()
                log.info("job.handed_back", job_id=job.id, queue=job.queue, attempt=job.attempt)
            else:
                self._lease_lost(job, "hand_back")
        self._holdings.remove(len(jobs))
        self._release(Counter(job.queue for job in jobs))

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
