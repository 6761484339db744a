"""The worker's background components under one task group, and their graceful stop."""

from __future__ import annotations

import uuid

import anyio
import asyncpg
import structlog
from anyio.abc import TaskStatus

from api_sender import Sender
from api_sender.schema import cancel_channel

from .db import statements as db
from .db.bounded import HandlerPool
from .db.connections import RETRYABLE_ERRORS
from .install import schedules_channel
from .jobs.spec import InstalledJob, JobContext
from .queue.availability import Availability
from .queue.completer import Completer
from .queue.cron import CronScheduler
from .queue.dispatcher import Dispatcher
from .queue.heartbeat import Heartbeat
from .queue.holdings import Holdings
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
        )
        self._background = anyio.CancelScope()
        self._pollers_done = anyio.Event()

    def interrupt(self, payload: str) -> None:
        """``<owner> <id>,<id>...`` from a cancel or delete: interrupt those of this process's
        running handlers (the job rows are final already)."""
        owner, _, ids = payload.partition(" ")
        if owner != str(self.owner):
            return
        self._interrupt({int(i) for i in ids.split(",") if i.isdigit()})

    def _interrupt(self, wanted: set[int]) -> None:
        """Interrupt the running handlers of these jobs, wherever they run here."""
        found = [job_id for poller in self.pollers for job_id in poller.interrupt(wanted)]
        log.info("job.interrupt_requested", ids=sorted(wanted), running=found)

    async def watch_cancels(self) -> None:
        """LISTEN_MODE=poll: no cancel NOTIFY arrives, so every poll interval, while handlers
        run, ask which of their jobs an operator cancelled or deleted, and interrupt those
        (contract section 10: within POLL_INTERVAL_SECONDS + 2 s)."""
        while True:
            await anyio.sleep(self._poll_interval)
            running = [job_id for poller in self.pollers for job_id in poller.running_ids()]
            if not running:
                continue
            try:
                with anyio.fail_after(max(5.0, self._poll_interval * 2)):
                    rows = await db.fetch(self._pool, self._sql.cancelled_among, ids=running)
            except RETRYABLE_ERRORS as exc:
                # The probe and the pollers report the database; look again next interval.
                log.debug("job.cancel_check_failed", error=f"{type(exc).__name__}: {exc}")
                continue
            if rows:
                self._interrupt({row["id"] for row in rows})

    def check(self) -> str | None:
        """Readiness: the listener must be connected (poll mode: the probe must answer)."""
        if self.dispatcher.listening:
            return None
        return "database probe failing" if self._polls else "listener not connected"

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start every component; report started once the listener is up; run until stopped."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._run_background)
            with anyio.fail_after(30):
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
                if self._polls:
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
