"""One queue's consumer: a fetcher (two when two batches fit) that claims batches, and
``concurrency`` runners."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial

import anyio
import structlog
from anyio.abc import TaskGroup

from ..db.connections import RETRYABLE_ERRORS, TRANSIENT_ERRORS, backoff_delay
from ..logging import CURRENT_JOB
from ..metrics import JOB_DURATION, DurationTally
from .availability import Availability
from .completer import Completer
from .holdings import Holdings
from .jobs import ClaimedJob, FinalFailure
from .store import JobStore
from .waker import Waker

log = structlog.get_logger("worker.queue")

#: A runner moves its deadline only when a job's expiry differs from the current one by more
#: than this (seconds): a burst of quick jobs shares one timer instead of re-arming it per job.
DEADLINE_SLACK = 0.001

#: How many of the latest answered claims a poller remembers the instants of: enough to hand
#: back what an unanswered claim took once the claims in flight with it are answered (a few).
ANSWERED_KEPT = 64

#: Runs one job; raising fails that job (raising :class:`FinalFailure` fails it for good).
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


@dataclass(frozen=True, slots=True)
class Unanswered:
    """Claims whose answer never came (their connection failed): they may have committed."""

    #: The newest claim instant answered before the first of them was sent (None: none yet).
    #: Each such claim's own transaction started later, so its jobs' instants are greater.
    since: bytes | None
    #: How many claims had been answered with jobs by then: those answered later hold jobs of
    #: instants greater than ``since`` too, and are told apart by their instants.
    answered: int

    def merged(self, since: bytes | None, answered: int) -> Unanswered:
        """These claims and one more, sent when ``since`` and ``answered`` were as given."""
        lowest = None if since is None or self.since is None else min(since, self.since)
        return Unanswered(lowest, min(answered, self.answered))


class Poller:
    """Claims jobs of one queue when woken and runs them; stops cleanly on request.

    A claimed job's expiry runs from its claim (the database's clock), so the poller never
    claims more than its runners can start at once: at most ``concurrency`` jobs are held (a
    fetch claims up to ``batch_size`` of the free slots), and a batch consumer claims a batch
    only for a free runner. No job waits in the worker's hands while its expiry runs, and one
    process never hoards work other replicas could run. A job is held from its claim until its
    outcome is written, so a slow completion write slows claiming down instead of piling up
    active jobs. Successes waiting to be written ride along with the next claim (one statement,
    one commit), except on one-per-key queues; while such a claim is in flight, the slots of
    the successes it carries count as free for the other fetcher (its commit completes them as
    it claims), so at most ``concurrency`` jobs are active in the database at any moment.

    Claimed work waits in a deque that the runners pop. The hot path costs no task switch per
    job: a runner takes the next job itself when its handler returns, and wakes one idle runner
    only while work is left over, so a handler that awaits hands the rest to the others. Each
    runner keeps one cancel scope across jobs and moves its deadline to the job's expiry; a scope
    that was cancelled (an expiry, an operator's cancel, the grace) is never reused for the
    next job.

    Runners start when work first finds none idle, up to ``concurrency``, and then stay: a
    worker whose handlers never await (or that is idle) holds a few tasks, not ``concurrency``
    of them (each parked runner is about 5 KB of the process's memory).
    """

    def __init__(
        self,
        consumer: Consumer,
        store: JobStore,
        completer: Completer,
        holdings: Holdings,
        availability: Availability | None = None,
    ) -> None:
        self.consumer = consumer
        self._availability = availability or Availability()
        self.waker = Waker()
        self._store = store
        self._completer = completer
        self._holdings = holdings
        self._capacity = Waker()
        self._stopping = False
        self._interrupted = False
        #: Jobs claimed whose outcome is not written yet (released by the completer).
        self._held = 0
        #: Slots of this queue's successes riding claims in flight, each claim's counted up to
        #: the slots it reserved: its commit completes them as it claims, so another claim may
        #: count them as free already (see _fetcher).
        self._carried = 0
        self._wants_room = False
        self._piggyback = not consumer.one_per_key
        #: The last claim carrying successes was refused: claim alone once, and let the
        #: completer write them (it writes a refused batch in parts).
        self._solo = False
        completer.watch(consumer.queue, self._settled)
        #: Claims answered with jobs so far, the instants of the latest (with their number) and
        #: the newest instant: after a claim whose answer never came they tell the jobs it may
        #: have taken from those of every claim answered (see _hand_back_unanswered).
        self._answered = 0
        self._instants: deque[tuple[int, bytes]] = deque(maxlen=ANSWERED_KEPT)
        self._newest: bytes | None = None
        self._unanswered: Unanswered | None = None
        self._in_flight = 0
        self._handing_back = False
        self._hand_back_attempt = 0
        #: Woken when the last claim in flight lands, and when a hand-back ends.
        self._quiet = Waker()
        #: Each runner's scope now, with its expiry, which holds the job whose handler runs in
        #: it (per-job consumers): a confirmed cancel interrupts exactly that run of the job,
        #: and a job running twice here (cancelled, retried and claimed again while its first
        #: handler ran on) is two runs. Per job only the expiry's ``job`` is set and cleared.
        self._running: dict[anyio.CancelScope, _Expiry] = {}
        #: The runs so interrupted whose handler has not ended yet, by ``id()`` of their
        #: ClaimedJob (the job itself is the value, so that id stays its own).
        self._cancelled: dict[int, ClaimedJob] = {}
        #: Job ids a cancel hint named before their run started here (kept by the runtime for
        #: a few seconds), and what to call when one of them starts: the hint came between the
        #: claim and the handler's start, and is checked again now that the run is known.
        self.early_hints: Mapping[int, float] = {}
        self.on_hinted_start: Callable[[int], None] = _nothing
        self._work: deque[Work] = deque()
        #: Runners waiting for work, each on its own event; ``_waking`` counts those set but
        #: not yet running, so a burst of work wakes one spare runner at a time.
        self._idle: deque[anyio.Event] = deque()
        self._waking = 0
        #: Runner tasks started so far (at most ``concurrency``), in the task group of run().
        self._runners = 0
        self._group: TaskGroup | None = None
        self._closed = False
        #: Handler run times, added to job_duration_seconds whenever outcomes are written.
        self._duration = DurationTally(JOB_DURATION.labels(consumer.queue))
        self._batches = consumer.run_batch is not None
        #: Batches claimed whose handler has not finished (batch consumers only).
        self._busy = 0
        if self._batches:
            self._limit = consumer.batch_size * consumer.concurrency
        else:
            self._limit = consumer.concurrency
        # Claim again once at least half a batch of room is free, not one slot at a time.
        self._threshold = max(1, min(consumer.batch_size, self._limit) // 2)
        # Two claims in flight when two batches fit (per-job consumers, not one-per-key): the
        # next batch is claimed while the database still answers the last, so the claim's
        # round trip is off the runners' critical path. Each claim reserves its slots before
        # it is sent, so the poller still never holds more than it can start.
        wide = (
            not self._batches
            and not consumer.one_per_key
            and consumer.batch_size > 1
            and self._limit >= 2 * consumer.batch_size
        )
        self._fetchers = 2 if wide else 1
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
        self._quiet.wake()

    def cancel_running(self) -> None:
        """Interrupt running handlers (grace exceeded); their jobs are handed back."""
        self._interrupted = True
        for scope in list(self._running):
            scope.cancel()

    def running(self) -> list[ClaimedJob]:
        """The claims whose handlers run now (per-job consumers), for the cancel check."""
        return [expiry.job for expiry in self._running.values() if expiry.job is not None]

    def interrupt(self, jobs: Iterable[ClaimedJob]) -> list[int]:
        """Interrupt these runs (claims from :meth:`running`) if their handlers still run: the
        rows say an operator cancelled or deleted them, so nothing is written for them. A run
        is matched by identity: a newer claim of the same job, started here since, is another
        run and is left alone."""
        wanted = {id(job) for job in jobs}
        found = []
        for expiry in list(self._running.values()):
            job = expiry.job
            if job is not None and id(job) in wanted:
                self._cancelled[id(job)] = job
                expiry.scope.cancel()
                found.append(job.id)
        return found

    async def run(self) -> None:
        """Fetch and run until stopped and every claimed job has an outcome."""
        try:
            async with anyio.create_task_group() as tg:
                self._group = tg
                try:
                    async with anyio.create_task_group() as fetchers:
                        for _ in range(self._fetchers):
                            fetchers.start_soon(self._fetcher)
                finally:
                    self._closed = True
                    while self._idle:
                        self._waking += 1
                        self._idle.popleft().set()
        finally:
            self._duration.flush()
            self.stopped.set()

    def _free(self) -> int:
        """Slots no claimed job holds, counting those lent by the claims in flight."""
        return self._limit - self._held + self._carried

    def _room(self) -> int:
        """Free slots if this poller claimed now, counting the successes it would write."""
        if self._batches and self._busy >= self.consumer.concurrency:
            return 0
        room = self._free()
        if self._piggyback:
            room += self._completer.untaken(self.consumer.queue)
        return room

    def _settled(self, n: int) -> None:
        """The completer wrote ``n`` outcomes of this queue: their slots are free."""
        self._duration.flush()
        self._held -= n
        self._wake_fetcher()

    def _wake_fetcher(self) -> None:
        # Wake the fetcher only when it waits for room and there is enough now (not per job).
        if self._wants_room and (self._room() >= self._threshold or self._held <= 0):
            self._wants_room = False
            self._capacity.wake()

    async def _fetcher(self) -> None:
        consumer = self.consumer
        queue = consumer.queue
        attempt = 0
        while not self._stopping:
            if self._unanswered is not None:
                await self._hand_back_unanswered()
                continue
            generation = self.waker.generation
            if self._room() < self._threshold and self._held > 0:
                self._wants_room = True
                await self._capacity.wait_since(self._capacity.generation)
                continue
            done = self._completer.take_done() if self._piggyback and not self._solo else []
            self._solo = False
            mine = sum(1 for job in done if job.queue == queue)
            want = min(consumer.batch_size, self._free() + mine)
            if want <= 0:  # another claim in flight took the room
                self._completer.restore_done(done)
                self._wants_room = True
                await self._capacity.wait_since(self._capacity.generation)
                continue
            # Reserved while the claim is in flight: the other fetcher sees the room as taken.
            # The successes it carries stay held until it commits, but their slots (up to the
            # ones it reserves) count as free for the other fetcher meanwhile: the commit that
            # makes this claim's jobs active completes them, so the jobs active at once stay
            # within the limit however the two commits interleave. Without this the other
            # fetcher could not carry its own successes while this claim is in flight: the
            # completer wrote them alone and the next claim waited for both statements.
            self._held += want
            credit = min(mine, want)
            self._carried += credit
            since, answered = self._newest, self._answered
            self._in_flight += 1
            try:
                if done:
                    jobs = await self._completer.write_successes(
                        done, partial(self._store.complete_and_claim, done, queue, want)
                    )
                else:
                    jobs = await self._store.claim(queue, want, one_per_key=consumer.one_per_key)
                attempt = 0
            except Exception as exc:
                if isinstance(exc, TRANSIENT_ERRORS):
                    # The connection failed under the claim: it may have committed.
                    u = self._unanswered
                    self._unanswered = (
                        Unanswered(since, answered) if u is None else u.merged(since, answered)
                    )
                self._landed()
                self._carried -= credit
                self._held -= want
                self._wake_fetcher()
                # Not written (or unknown: a second write of a written job matches nothing and
                # is only logged as lease lost): the successes go out with the next flush.
                self._completer.restore_done(done)
                retryable = isinstance(exc, RETRYABLE_ERRORS)
                if not retryable and not done:
                    raise
                # Refused with successes on board: one of them may be what the database
                # refuses; the completer writes them apart, and this poller claims alone.
                self._solo = not retryable
                await self._back_off("poller.claim_failed", exc, attempt)
                attempt += 1
                continue
            self._landed()
            if jobs:
                self._answered += 1
                instant = jobs[0].claim  # one statement: one transaction, one instant
                self._instants.append((self._answered, instant))
                if self._newest is None or instant > self._newest:
                    self._newest = instant
            self._carried -= credit
            if len(jobs) < want:
                self._held -= want - len(jobs)
                self._wake_fetcher()
            if jobs:
                self._holdings.add(len(jobs))
                if self._batches:
                    self._busy += 1
                    self._work.append(jobs)
                else:
                    self._work.extend(jobs)
                self._wake_runner()
            if len(jobs) < want:
                await self.waker.wait_since(generation)

    async def _back_off(self, event: str, exc: Exception, attempt: int) -> None:
        """Log a failed statement as ``event`` and sleep before try ``attempt + 1``."""
        if isinstance(exc, TRANSIENT_ERRORS):
            self._availability.lost()
        delay = backoff_delay(attempt)
        log.warning(
            event, queue=self.queue, error=f"{type(exc).__name__}: {exc}", retry_in=round(delay, 2)
        )
        await anyio.sleep(delay)

    def _landed(self) -> None:
        """A claim sent is answered or failed."""
        self._in_flight -= 1
        if not self._in_flight and self._unanswered is not None:
            self._quiet.wake()

    async def _hand_back_unanswered(self) -> None:
        """After a claim whose answer never came: once no claim of the queue is in flight (and
        none is sent meanwhile), hand back the jobs it may have taken, so they run now instead
        of waiting out their expiry under this live worker, which no rescue takes them from."""
        unanswered = self._unanswered
        assert unanswered is not None
        generation = self._quiet.generation
        if self._in_flight or self._handing_back:
            await self._quiet.wait_since(generation)
            return
        if self._answered - unanswered.answered > len(self._instants):
            # Too many claims answered since to tell them apart (never seen: a claim lands
            # a round trip after it is sent): its jobs, if any, run after their expiry.
            log.warning("poller.unanswered_claim_unchecked", queue=self.queue)
            self._unanswered = None
            return
        kept = [instant for n, instant in self._instants if n > unanswered.answered]
        self._handing_back = True
        try:
            ids = await self._store.hand_back_unanswered(self.queue, unanswered.since, kept)
        except Exception as exc:
            if not isinstance(exc, RETRYABLE_ERRORS):
                log.error(
                    "poller.unanswered_claim_unchecked",
                    queue=self.queue,
                    error=f"{type(exc).__name__}: {exc}",
                )
                self._unanswered = None
                return
            await self._back_off("poller.hand_back_failed", exc, self._hand_back_attempt)
            self._hand_back_attempt += 1
            return
        finally:
            self._handing_back = False
            self._quiet.wake()
        self._hand_back_attempt = 0
        self._unanswered = None
        if ids:
            log.warning(
                "poller.unanswered_claim_handed_back",
                queue=self.queue,
                jobs=len(ids),
                job_ids=ids[:20],
            )
        else:
            log.info("poller.unanswered_claim_took_nothing", queue=self.queue)

    def _wake_runner(self) -> None:
        """Wake one idle runner, or start one while fewer than ``concurrency`` run, unless one
        is already on its way."""
        if self._waking:
            return
        if self._idle:
            self._waking += 1
            self._idle.popleft().set()
        elif self._runners < self.consumer.concurrency and self._group is not None:
            self._runners += 1
            self._waking += 1
            self._group.start_soon(self._runner)

    async def _next(self) -> Work | None:
        """The next claimed work, or ``None`` once the fetcher is done and nothing is left."""
        while not self._work:
            if self._closed:
                return None
            event = anyio.Event()
            self._idle.append(event)
            try:
                await event.wait()
            finally:
                if event.is_set():
                    self._waking -= 1
                else:
                    self._idle.remove(event)
        work = self._work.popleft()
        if self._work:
            self._wake_runner()
        return work

    def _done(self, work: Work) -> None:
        """``work``'s outcomes were handed to the completer: its runner is free, and a claim
        may now carry them."""
        if isinstance(work, list):
            self._busy -= 1
        if self._wants_room:
            self._wake_fetcher()

    async def _runner(self) -> None:
        self._waking -= 1  # started by _wake_runner as the runner on its way
        # Each runner is its own task with its own context: bind the queue once, the job per run.
        structlog.contextvars.bind_contextvars(queue=self.queue)
        finished = False
        while not finished:
            current: Work | None = None
            with anyio.CancelScope() as scope:
                expiry = _Expiry(scope)
                self._running[scope] = expiry
                try:
                    while True:
                        current = None
                        work = await self._next()
                        if work is None:
                            finished = True
                            break
                        if scope.cancel_called:
                            # The last job's deadline passed while this runner waited and the
                            # wake-up came in the same turn: the cancel is pending, and would
                            # fail this job as expired at its first await. Put it back and take
                            # it again in a fresh scope.
                            self._work.appendleft(work)
                            break
                        current = work
                        if self._stopping:
                            self._hand_back(work)
                        elif isinstance(work, list):
                            await self._run_batch(work, expiry)
                        else:
                            await self._run_one(work, expiry)
                        current = None
                        if scope.cancel_called:
                            # The handler ended although its scope was cancelled (its work in a
                            # thread, say, which a cancel does not stop) and its outcome is
                            # recorded: the cancel is still pending and would interrupt the
                            # next job at its first await. Leave this scope; a fresh one
                            # runs the next job.
                            break
                finally:
                    del self._running[scope]
            if scope.cancelled_caught and current is not None:
                self._interrupted_work(current)

    def _hand_back(self, work: Work) -> None:
        jobs = work if isinstance(work, list) else [work]
        for job in jobs:
            self._completer.handed_back(job)
        self._done(work)

    def _interrupted_work(self, work: Work) -> None:
        """A runner's scope was cancelled mid-run: an operator's cancel (nothing to write),
        grace exceeded (hand back) or expired."""
        jobs = work if isinstance(work, list) else [work]
        if not isinstance(work, list) and self._cancelled.pop(id(work), None) is not None:
            self._completer.dropped(work)
        elif self._interrupted:
            for job in jobs:
                self._completer.handed_back(job)
        elif isinstance(work, list):
            expire = min(job.expire_seconds for job in jobs)
            for job in jobs:
                self._completer.failed(job, f"expired: batch ran past {expire}s")
        else:
            self._completer.failed(work, f"expired: ran past {work.expire_seconds}s")
        self._done(work)

    async def _run_one(self, job: ClaimedJob, expiry: _Expiry) -> None:
        run_job = self.consumer.run_job
        assert run_job is not None
        started = time.perf_counter()
        # Every line logged while it runs names the job (see worker.logging.CURRENT_JOB).
        CURRENT_JOB.set((job.id, job.attempt))
        expiry.start(job.expire_seconds)
        expiry.job = job
        if self.early_hints and job.id in self.early_hints:
            self.on_hinted_start(job.id)
        try:
            await run_job(job)
        except FinalFailure as exc:
            self._ended(job, exc.error, final=True)
        except Exception as exc:
            # Expiry cancels the runner's scope (see _interrupted_work); a TimeoutError here is
            # the handler's own and is reported as such.
            self._ended(job, f"{type(exc).__name__}: {exc}")
        else:
            if self._cancelled:
                self._ended(job, None)
            else:
                self._completer.succeeded(job)
        finally:
            expiry.job = None
            self._duration.observe(time.perf_counter() - started)
        self._done(job)

    def _ended(self, job: ClaimedJob, error: str | None, *, final: bool = False) -> None:
        """Record the outcome of ``job``'s handler, which returned (``error`` None) or raised."""
        if self._cancelled.pop(id(job), None) is not None:
            # Interrupted, yet the handler ended without seeing it (it never awaited again, or
            # swallowed the cancel): its row is final already, so nothing is written for it.
            self._completer.dropped(job)
        elif error is None:
            self._completer.succeeded(job)
        else:
            self._completer.failed(job, error, final=final)

    async def _run_batch(self, jobs: list[ClaimedJob], expiry: _Expiry) -> None:
        run_batch = self.consumer.run_batch
        assert run_batch is not None
        expire = min(job.expire_seconds for job in jobs)
        started = time.perf_counter()
        structlog.contextvars.bind_contextvars(batch=len(jobs))
        expiry.start(expire)
        try:
            failures = await run_batch(jobs)
            failures = failures or {}
            for job in jobs:
                error = failures.get(job.id)
                if error is None:
                    self._completer.succeeded(job)
                else:
                    self._completer.failed(job, error)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            for job in jobs:
                self._completer.failed(job, error)
        finally:
            self._duration.observe(time.perf_counter() - started)
        self._done(jobs)


def _nothing(_job_id: int) -> None:
    """No cancel check to wake (a poller outside a worker runtime)."""


class _Expiry:
    """A runner's cancel scope, whose deadline each job moves to its own expiry.

    The deadline is on the event loop's clock, which anyio reads at about 1.6 µs a call; the
    runner reads ``time.monotonic()`` instead (the same clock source; the offset is measured once
    per scope) and re-arms the timer only when the deadline moves by more than
    ``DEADLINE_SLACK``. Between jobs the old deadline stays: if it passes while the runner
    waits for work, the scope ends with no job in hand and the runner opens a new one.
    """

    __slots__ = ("_offset", "job", "scope")

    def __init__(self, scope: anyio.CancelScope) -> None:
        self.scope = scope
        #: The job whose handler runs in this scope now (per-job consumers), else None.
        self.job: ClaimedJob | None = None
        self._offset = anyio.current_time() - time.monotonic()

    def start(self, seconds: float) -> None:
        """A job that may run ``seconds`` starts now."""
        deadline = time.monotonic() + self._offset + seconds
        if abs(deadline - self.scope.deadline) > DEADLINE_SLACK:
            self.scope.deadline = deadline
