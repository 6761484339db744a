"""Outcomes of handlers, written to the database in batches by one task per process."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol, TypeVar

import anyio
import anyio.lowlevel
import structlog

from ..db.connections import RETRYABLE_ERRORS, TRANSIENT_ERRORS, backoff_delay
from ..metrics import JOBS_COMPLETED, JOBS_FAILED, JOBS_HANDED_BACK, JOBS_LEASE_LOST
from .availability import Availability
from .holdings import Holdings
from .jobs import ClaimedJob
from .store import FailOutcome, JobStore, storable_text
from .unflushed import UnflushedCompletions

log = structlog.get_logger("worker.queue")

#: How often one outcome the database refuses (a non-retryable error, its batch already split
#: down to it) is tried before it is given up.
_TRIES_PER_OUTCOME = 3

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class LazyWrite(Protocol[T_co]):
    """A write of successes (``lazy``: commit without waiting for the disk) that returns its own
    result and the ids that no longer matched their claim."""

    def __call__(self, *, lazy: bool) -> Awaitable[tuple[T_co, Iterable[int]]]: ...


class Completer:
    """Buffers outcomes and flushes them: one complete, one fail, one hand-back statement per
    flush, however many handlers finished meanwhile. A job is done only when its flush commits.

    A poller about to claim may take the buffered successes instead (:meth:`take_done`) and
    write them in its claim statement; either way each outcome is written exactly once, and the
    poller whose job it was hears of it (:meth:`watch`) only once it is written.
    """

    def __init__(
        self,
        store: JobStore,
        holdings: Holdings,
        availability: Availability | None = None,
        on_finished: Callable[[], None] | None = None,
        unflushed: UnflushedCompletions | None = None,
    ) -> None:
        self._availability = availability
        #: Where completions committed without waiting for the disk are kept until flushed
        #: (None: every completion waits for the disk).
        self._unflushed = unflushed
        #: Told whenever jobs completed or failed for good here (the throughput tally).
        self._on_finished = on_finished
        self._store = store
        self._holdings = holdings
        self._done: list[ClaimedJob] = []
        #: Failed attempts: the job, its error text, and whether it fails for good (final).
        self._failed: list[tuple[ClaimedJob, str, bool]] = []
        self._back: list[ClaimedJob] = []
        self._pending = anyio.Event()
        # Held while a flush runs, so a drain at shutdown waits for the one in progress.
        self._lock = anyio.Lock()
        self._watchers: dict[str, Callable[[int], None]] = {}
        self._untaken: Counter[str] = Counter()
        #: Outcomes that matched no row, to be told apart (an operator's cancel or delete, or a
        #: lost lease) by the job's state now, off the hot path.
        self._unmatched: list[tuple[ClaimedJob, str]] = []

    def watch(self, queue: str, settled: Callable[[int], None]) -> None:
        """Call ``settled(n)`` whenever ``n`` outcomes of ``queue`` are written (or given up)."""
        self._watchers[queue] = settled

    def take_done(self) -> list[ClaimedJob]:
        """Hand the buffered successes to a caller that writes them itself (then
        :meth:`settle_done`, or :meth:`restore_done` if its write failed)."""
        return self._take()

    def lazy_session(self) -> int:
        """Non-zero: write the next completions without waiting for the disk, then pass this
        number to :meth:`settle_done` (see worker.queue.unflushed)."""
        return 0 if self._unflushed is None else self._unflushed.session()

    def settle_done(self, jobs: list[ClaimedJob], lost: Iterable[int], session: int = 0) -> None:
        """``jobs`` were written as completed, except the ids in ``lost`` (lease lost);
        ``session``: lazily, under that watch session."""
        if jobs:
            lost = set(lost)
            if session and self._unflushed is not None:
                self._unflushed.written(
                    session, [job for job in jobs if job.id not in lost] if lost else jobs
                )
            self._settle_completed(jobs, lost)

    async def write_successes(
        self,
        jobs: list[ClaimedJob],
        write: LazyWrite[T],
    ) -> T:
        """Write ``jobs`` as completed through ``write(lazy=...)``, which returns its own result and
        the ids that no longer matched: lazily when a watch session allows, then settled. A
        write that raised may have committed: its jobs are kept as written
        (:meth:`maybe_written`) before the error goes on; taking them back is the caller's."""
        session = self.lazy_session()
        try:
            result, lost = await write(lazy=session != 0)
        except BaseException:
            self.maybe_written(session, jobs)
            raise
        self.settle_done(jobs, lost, session)
        return result

    def maybe_written(self, session: int, jobs: list[ClaimedJob]) -> None:
        """A lazy write of these successes failed without a clear answer (it may have
        committed): kept until flushed as if written, since writing them again may match nothing
        and flush nothing. They are also restored for another write, as any failed one."""
        if session and self._unflushed is not None:
            self._unflushed.written(session, jobs)

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

    def failed(self, job: ClaimedJob, error: str, *, final: bool = False) -> None:
        """Record a failed attempt of ``job``; ``final``: it fails for good, whatever retries it
        has left (its data can never succeed), to its dead letter."""
        # Made storable here, so the log line and the stored error say the same.
        self._failed.append((job, storable_text(error), final))
        self._signal()

    def handed_back(self, job: ClaimedJob) -> None:
        """Record that ``job`` was claimed but will not run here (shutdown)."""
        self._back.append(job)
        self._signal()

    def dropped(self, job: ClaimedJob) -> None:
        """``job``'s handler was interrupted because an operator cancelled or deleted it: its
        row is final already, nothing is written; its slot is free."""
        log.info("job.cancel_interrupted", job_id=job.id, queue=job.queue, attempt=job.attempt)
        self._holdings.remove(1)
        self._release(Counter({job.queue: 1}))

    def _signal(self) -> None:
        self._pending.set()

    @property
    def has_pending(self) -> bool:
        """Whether outcomes wait to be written."""
        return bool(self._done or self._failed or self._back or self._unmatched)

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
        """Write the buffered outcomes: successes, failures, hand-backs, one statement each."""
        done, failed, back = self._take(), self._failed, self._back
        self._failed, self._back = [], []
        await self._write("complete", done, self._write_done, list)
        await self._write("fail", failed, self._write_failed, _jobs_of_failures)
        await self._write("hand_back", back, self._write_back, list)
        if self._unmatched:
            await self._explain_unmatched()

    async def _explain_unmatched(self) -> None:
        """Log each outcome that matched no row as what it was: ``job.cancel_fenced`` when an
        operator cancelled or deleted the job meanwhile (not a lost lease), else
        ``job.lease_lost`` (rescued or expired), counted in jobs_lease_lost_total."""
        unmatched, self._unmatched = self._unmatched, []
        states: dict[int, str] | None
        try:
            states = await self._store.states([job.id for job, _ in unmatched])
        except Exception as exc:
            # Unexplained, they are reported as what they usually are: lost leases.
            log.warning("job.unmatched_unexplained", error=f"{type(exc).__name__}: {exc}")
            states = None
        for job, write in unmatched:
            state = None if states is None else states.get(job.id, "deleted")
            if state in ("cancelled", "deleted"):
                log.info(
                    "job.cancel_fenced",
                    job_id=job.id,
                    queue=job.queue,
                    attempt=job.attempt,
                    write=write,
                    state=state,
                    hint="an operator cancelled or deleted the job; this result is dropped",
                )
                continue
            JOBS_LEASE_LOST.labels(job.queue).inc()
            log.warning(
                "job.lease_lost",
                job_id=job.id,
                queue=job.queue,
                attempt=job.attempt,
                write=write,
                hint="the job was rescued or expired; this result is dropped",
            )

    async def _write(
        self,
        write: str,
        items: list[T],
        statement: Callable[[list[T]], Awaitable[None]],
        jobs_of: Callable[[list[T]], list[ClaimedJob]],
    ) -> None:
        """Write ``items`` through ``statement``, retrying retryable errors with backoff.

        A batch the database refuses (any other error) is written again in halves, down to the
        single outcome it refuses, which is tried a few times and then given up: one row never
        sinks the rest of the flush.
        """
        parts = [items] if items else []  # a stack: the part on top is written next
        attempt = 0
        refusals = 0
        while parts:
            part = parts[-1]
            try:
                await statement(part)
            except RETRYABLE_ERRORS as exc:
                if isinstance(exc, TRANSIENT_ERRORS) and self._availability is not None:
                    self._availability.lost()
                delay = backoff_delay(attempt)
                attempt += 1
                log.warning(
                    "job.outcome_write_retry",
                    write=write,
                    error=f"{type(exc).__name__}: {exc}",
                    pending=sum(len(p) for p in parts),
                    retry_in=round(delay, 2),
                )
                await anyio.sleep(delay)
                continue
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                if len(part) > 1:
                    parts.pop()
                    half = len(part) // 2
                    parts += [part[half:], part[:half]]
                    log.warning("job.outcome_write_split", write=write, jobs=len(part), error=error)
                    continue
                refusals += 1
                log.error("job.outcome_write_failed", write=write, error=error, tries=refusals)
                if refusals < _TRIES_PER_OUTCOME:
                    await anyio.sleep(backoff_delay(refusals))
                    continue
                self._give_up(write, jobs_of(part), error)
            parts.pop()
            attempt = refusals = 0

    async def _write_done(self, jobs: list[ClaimedJob]) -> None:
        async def complete(*, lazy: bool) -> tuple[None, set[int]]:
            return None, await self._store.complete_lost(jobs, lazy=lazy)

        await self.write_successes(jobs, complete)

    async def _write_failed(self, failures: list[tuple[ClaimedJob, str, bool]]) -> None:
        final = {job.id for job, _, is_final in failures if is_final}
        pairs = [(job, error) for job, error, _ in failures]
        self._settle_failed(failures, await self._store.fail(pairs, final=final))

    async def _write_back(self, jobs: list[ClaimedJob]) -> None:
        self._settle_back(jobs, await self._store.hand_back(jobs))

    def _give_up(self, write: str, jobs: list[ClaimedJob], error: str) -> None:
        """The database refuses these outcomes: release them (the jobs stay active until
        rescued at their expiry; at least once still holds)."""
        self._holdings.remove(len(jobs))
        self._release(Counter(job.queue for job in jobs))
        log.error(
            "job.outcome_given_up",
            write=write,
            jobs=len(jobs),
            ids=[job.id for job in jobs],
            error=error,
            hint="the job stays active until its expiry, then it is rescued and runs again",
        )

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
        if self._on_finished is not None and len(lost) < len(jobs):
            self._on_finished()
        self._holdings.remove(len(jobs))
        self._release(per_queue)

    def _settle_failed(
        self, failures: list[tuple[ClaimedJob, str, bool]], outcomes: list[FailOutcome]
    ) -> None:
        states = {o.id: o.state for o in outcomes}
        per_queue: Counter[str] = Counter()
        for job, error, final in failures:
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
                **({"final": True} if final else {}),
            )
        for queue, n in per_queue.items():
            JOBS_FAILED.labels(queue).inc(n)
        if self._on_finished is not None and "failed" in states.values():
            self._on_finished()
        self._holdings.remove(len(failures))
        self._release(Counter(job.queue for job, _, _ in failures))

    def _settle_back(self, jobs: list[ClaimedJob], matched: set[int]) -> None:
        for job in jobs:
            if job.id in matched:
                JOBS_HANDED_BACK.labels(job.queue).inc()
                log.info("job.handed_back", job_id=job.id, queue=job.queue, attempt=job.attempt)
            else:
                self._lease_lost(job, "hand_back")
        self._holdings.remove(len(jobs))
        self._release(Counter(job.queue for job in jobs))

    def _lease_lost(self, job: ClaimedJob, write: str) -> None:
        """An outcome matched no row: explained (and logged) at the end of the flush."""
        self._unmatched.append((job, write))
        self._signal()


def _jobs_of_failures(failures: list[tuple[ClaimedJob, str, bool]]) -> list[ClaimedJob]:
    return [job for job, _, _ in failures]
