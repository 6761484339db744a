"""The worker's background components under one task group, and their graceful stop."""

from __future__ import annotations

import time
import uuid

import anyio
import asyncpg
import structlog
from anyio.abc import TaskStatus

from api_sender import Sender
from api_sender.schema import cancel_channel

from .db import statements as db
from .db.bounded import HandlerPool
from .db.connections import RETRYABLE_ERRORS, backoff_delay
from .install import schedules_channel
from .jobs.spec import InstalledJob, JobContext
from .queue.availability import Availability
from .queue.completer import Completer
from .queue.cron import CronScheduler
from .queue.dispatcher import Dispatcher
from .queue.heartbeat import Heartbeat
from .queue.holdings import Holdings
from .queue.jobs import ClaimedJob
from .queue.maintenance import Maintenance
from .queue.poller import Poller
from .queue.sql import render
from .queue.store import JobStore
from .queue.throughput import Tally
from .queue.unflushed import UnflushedCompletions
from .settings import Settings

log = structlog.get_logger("worker.runtime")

#: Pool connections kept free of handlers for the claim, completion and heartbeat statements.
RESERVED_CONNECTIONS = 2
#: How often a polling worker (LISTEN_MODE=poll) re-reads the cron schedules, which a notify
#: worker re-reads when an install changes them.
POLL_MODE_CRON_RELOAD_SECONDS = 30.0
#: After a cancel check the next one waits at least this long (seconds): a flood of cancel
#: NOTIFYs, which any role may send, costs at most this many reads a second, while a real
#: cancel is still interrupted well within the contract's 2 s.
CANCEL_CHECK_GAP = 0.05
#: How long one cancel check may take before it is given up and tried again.
CANCEL_CHECK_TIMEOUT = 5.0
#: The longest pause before a cancel check that failed is tried again (seconds).
CANCEL_CHECK_RETRY_CAP = 1.0
#: How long a hinted job id that was not running here stays on watch (seconds): its claim may
#: have committed with its handler not started yet (the claim's answer on its way, the job
#: waiting for a runner), and the check runs again when it starts.
EARLY_HINT_SECONDS = 5.0
#: At most this many ids are watched so (a NOTIFY flood naming random ids costs no more).
_EARLY_HINTS_KEPT = 10_000
#: The longest job id a cancel hint may name (a bigint has at most 19 digits).
_MAX_ID_DIGITS = 19
#: How many ids a cancel log line lists: a NOTIFY anyone sends may name thousands.
_IDS_LOGGED = 50


class WorkerRuntime:
    """Pollers, the listener, the completer, heartbeat, maintenance and cron of one process.

    If any component dies, the task group fails and the process exits non-zero rather than
    fetching on without, say, its heartbeat.
    """

    def __init__(
        self,
        settings: Settings,
        session_url: str,
        pool: asyncpg.Pool,
        sender: Sender,
        jobs: list[InstalledJob],
    ) -> None:
        schema = settings.jobs_schema
        self.owner = uuid.uuid4()
        sql = render(schema)
        self.store = JobStore(pool, sql, self.owner)
        self.holdings = Holdings()
        #: One clock of database availability for the whole process: every loop reports a
        #: lost database, and maintenance judges other workers only after a stale interval.
        self.availability = Availability()
        self.tally = Tally(pool, schema)
        #: Completions commit without waiting for the disk and are kept until flushed.
        self.unflushed = UnflushedCompletions(session_url, self.store)
        self.completer = Completer(
            self.store,
            self.holdings,
            self.availability,
            on_finished=self.tally.finished,
            unflushed=self.unflushed,
        )
        handler_pool = HandlerPool(pool, settings.database_pool_size - RESERVED_CONNECTIONS)
        context = JobContext(
            settings=settings, pool=handler_pool, sender=sender, session_url=session_url
        )
        self.pollers = [
            Poller(
                job.make_consumer(context),
                self.store,
                self.completer,
                self.holdings,
                self.availability,
            )
            for job in jobs
        ]
        width = sum(p.consumer.concurrency for p in self.pollers)
        if width > handler_pool.limit:
            log.warning(
                "pool.narrower_than_concurrency",
                handlers=width,
                handler_connections=handler_pool.limit,
                hint="handlers that use the database wait for a connection; raise "
                "DATABASE_POOL_SIZE to run them all at once",
            )
        self.heartbeat = Heartbeat(
            pool,
            sql,
            self.owner,
            self.holdings,
            interval=settings.heartbeat_seconds,
            availability=self.availability,
        )
        self.maintenance = Maintenance(
            self.store,
            sql,
            schema,
            interval=settings.maintenance_interval_seconds,
            stale_seconds=settings.worker_stale_seconds,
            own_beat=self.heartbeat.beat_if_holding,
            availability=self.availability,
        )
        self.cron = CronScheduler(
            pool,
            sql,
            [job.queue for job in jobs],
            availability=self.availability,
            # No change notification reaches a polling worker: re-read the schedules sooner.
            reload_seconds=POLL_MODE_CRON_RELOAD_SECONDS if settings.polls else None,
        )
        min_retention = (
            min(
                min(job.options.retention_seconds, job.options.failed_retention_seconds)
                for job in jobs
            )
            if jobs
            else 3600
        )
        self._pool = pool
        self._sql = sql
        self._polls = settings.polls
        self._poll_interval = settings.poll_interval_seconds
        self.dispatcher = Dispatcher(
            session_url,
            schema,
            sql,
            {p.queue: p.waker for p in self.pollers},
            poll_interval=settings.poll_interval_seconds,
            stale_seconds=settings.worker_stale_seconds,
            on_rescue_due=self.maintenance.trigger_rescue,
            on_prune_due=self.maintenance.trigger_prune,
            min_retention_seconds=float(min_retention),
            extra_channels={
                schedules_channel(schema): self.cron.schedules_changed,
                cancel_channel(schema): self.interrupt,
            },
            availability=self.availability,
            poll_through=pool if settings.polls else None,
            on_listening=self._missed_hints,
        )
        self._background = anyio.CancelScope()
        self._pollers_done = anyio.Event()
        self._owner_text = str(self.owner)
        #: Job ids named by cancel NOTIFYs since the last cancel check, and its wake-up.
        self._hinted: set[int] = set()
        self._hint = anyio.Event()
        #: The next cancel check looks at every running claim, not only the hinted ones.
        self._check_every = False
        #: Hinted ids that were not running here at their check, with when they stop being
        #: watched; every poller looks them up as a job starts (see Poller.early_hints).
        self._early: dict[int, float] = {}
        for poller in self.pollers:
            poller.early_hints = self._early
            poller.on_hinted_start = self._hinted_start

    def interrupt(self, payload: str) -> None:
        """A cancel NOTIFY, ``<owner> <id>,<id>...``: sent by a cancel or delete, but any role
        may send one (and one sent for an earlier claim may come late), so it is only a hint.
        Its ids are kept for the cancel check, woken here, which interrupts only the handlers
        whose rows confirm the cancel (:meth:`watch_cancels`). Never raises: a payload is
        anyone's text."""
        owner, _, ids = payload.partition(" ")
        if owner != self._owner_text:
            return
        wanted = {
            int(i)
            for i in ids.split(",")
            if i.isascii() and i.isdigit() and len(i) <= _MAX_ID_DIGITS
        }
        if wanted:
            self._hinted |= wanted
            self._hint.set()

    def _hinted_start(self, job_id: int) -> None:
        """A job a cancel hint named before it ran here has started: check it now."""
        self._early.pop(job_id, None)
        self._hinted.add(job_id)
        self._hint.set()

    def _watch_early(self, ids: set[int]) -> None:
        """Keep hinted ids that were not running for EARLY_HINT_SECONDS, and check at once any
        that started while the check ran (it looked at the runs before its query)."""
        now = time.monotonic()
        for job_id in [i for i, until in self._early.items() if until <= now]:
            del self._early[job_id]
        started = {job.id for poller in self.pollers for job in poller.running()} & ids
        if started:
            self._hinted |= started
            self._hint.set()
        for job_id in ids - started:
            if len(self._early) >= _EARLY_HINTS_KEPT:
                break
            self._early[job_id] = now + EARLY_HINT_SECONDS

    def _missed_hints(self) -> None:
        """The listener (re)connected: a cancel committed while it was not listening sent its
        NOTIFY to no one, so the next check asks about every running claim."""
        self._check_every = True
        self._hint.set()

    async def watch_cancels(self) -> None:
        """The one cancel check: after cancel hints (NOTIFY), and with LISTEN_MODE=poll (where
        none arrives) every poll interval, ask the rows which of this process's running claims
        an operator cancelled or deleted, and interrupt those handlers (contract section 10:
        within 2 s, or POLL_INTERVAL_SECONDS + 2 s). Hints coalesce: every one that arrives
        while a check runs (or waits its gap) is answered by the next single read."""
        failures = 0
        while True:
            if self._polls:
                with anyio.move_on_after(self._poll_interval):
                    await self._hint.wait()
            else:
                await self._hint.wait()
            self._hint = anyio.Event()
            hinted, self._hinted = self._hinted, set()
            every, self._check_every = self._polls or self._check_every, False
            try:
                await self._check_cancels(hinted, every=every)
            except RETRYABLE_ERRORS as exc:
                # A hint is not sent again: keep what this check was for, and try again soon.
                self._hinted |= hinted
                if every and not self._polls:
                    self._check_every = True
                if hinted or self._check_every:
                    self._hint.set()
                delay = backoff_delay(failures, cap=CANCEL_CHECK_RETRY_CAP)
                failures += 1
                # Only hints make it worth a warning: the probe and the pollers report the
                # database itself.
                (log.warning if hinted else log.debug)(
                    "job.cancel_check_failed",
                    error=f"{type(exc).__name__}: {exc}",
                    hinted=sorted(hinted)[:_IDS_LOGGED],
                    retry_in=round(delay, 2),
                )
                await anyio.sleep(delay)
                continue
            failures = 0
            await anyio.sleep(CANCEL_CHECK_GAP)

    async def _check_cancels(self, hinted: set[int], *, every: bool) -> None:
        """Interrupt the running claims (of the ``hinted`` jobs; ``every``: all of them) whose
        rows say they were cancelled or deleted; log the hints the rows did not confirm."""
        running = [job for poller in self.pollers for job in poller.running()]
        if not every:
            running = [job for job in running if job.id in hinted]
        confirmed: list[ClaimedJob] = []
        if running:
            with anyio.fail_after(CANCEL_CHECK_TIMEOUT):
                rows = await db.fetch(
                    self._pool,
                    self._sql.cancelled_among,
                    ids=[job.id for job in running],
                    attempts=[job.attempt for job in running],
                    claims=[job.claim for job in running],
                    owner=self.owner,
                )
            found = {(row["id"], row["attempt"], bytes(row["claim"])) for row in rows}
            confirmed = [job for job in running if (job.id, job.attempt, job.claim) in found]
        if confirmed:
            interrupted = [i for poller in self.pollers for i in poller.interrupt(confirmed)]
            log.info(
                "job.interrupt_requested",
                ids=sorted(job.id for job in confirmed),
                running=sorted(interrupted),
            )
        ignored = hinted - {job.id for job in confirmed}
        self._watch_early(ignored - {job.id for job in running})
        if ignored:
            # Not cancelled for the claim running here (a NOTIFY anyone sent, or one for an
            # earlier claim of a job retried and claimed again since), or not running here.
            unconfirmed = sorted({job.id for job in running} & ignored)
            (log.warning if unconfirmed else log.info)(
                "job.cancel_hint_ignored",
                ids=sorted(ignored)[:_IDS_LOGGED],
                count=len(ignored),
                running=unconfirmed,
                hint="a cancel NOTIFY the job rows do not confirm for a claim running here;"
                " nothing was interrupted",
            )

    def check(self) -> str | None:
        """Readiness: the listener must be connected (poll mode: the probe must answer); while
        it is not, the reason names the last error that kept it from connecting."""
        if self.dispatcher.listening:
            return None
        reason = "database probe failing" if self._polls else "listener not connected"
        problem = self.dispatcher.problem
        return reason if problem is None else f"{reason}: {problem}"

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start every component; report started once the listener is up; run until stopped."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._run_background)
            # No time limit: while the listener cannot connect (the database unreachable, or
            # refusing its set-up), the process stays up, not ready (see check), and retries;
            # exiting would only restart into the same wait, a crash loop.
            await self.dispatcher.first_listen.wait()
            log.info(
                "worker.started", worker_id=str(self.owner), queues=[p.queue for p in self.pollers]
            )
            task_status.started()
            async with anyio.create_task_group() as pollers:
                for poller in self.pollers:
                    pollers.start_soon(poller.run)
            self._pollers_done.set()

    async def _run_background(self) -> None:
        with self._background:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.completer.run)
                tg.start_soon(self.unflushed.run)
                tg.start_soon(self.dispatcher.run)
                tg.start_soon(self.heartbeat.run)
                tg.start_soon(self.maintenance.run)
                tg.start_soon(self.cron.run)
                tg.start_soon(self.tally.run)
                tg.start_soon(self.watch_cancels)

    async def shutdown(self, grace: float) -> None:
        """Stop claiming, let handlers finish within ``grace``, hand the rest back, flush."""
        for poller in self.pollers:
            poller.stop()
        with anyio.move_on_after(grace) as waited:
            await self._pollers_done.wait()
        if waited.cancelled_caught:
            log.warning(
                "shutdown.grace_exceeded",
                grace_seconds=grace,
                hint="running handlers are interrupted and their jobs handed back",
            )
            for poller in self.pollers:
                poller.cancel_running()
            with anyio.move_on_after(5):
                await self._pollers_done.wait()
        with anyio.move_on_after(10):
            await self.completer.drain()
        # Completions committed lazily: wait for their flush (a few hundred ms at most, the
        # server's WAL writer), so none is left that a crash of the server could undo; before
        # the worker row goes, since its active jobs are then anyone's to rescue.
        await self.unflushed.settled(3.0)
        with anyio.move_on_after(5):
            await self.heartbeat.forget()
        self._background.cancel()
