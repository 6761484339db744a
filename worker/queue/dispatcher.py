"""The listener: LISTEN/NOTIFY wakes pollers at once; a probe every poll interval is the fallback.

Both run on one dedicated connection (never a pooled one: asyncpg's pool would UNLISTEN it).
The probe is also that connection's liveness check, so an idle worker costs one read-only
statement per poll interval and writes nothing.

With ``LISTEN_MODE=poll`` (behind a transaction pooler, contract section 12) there is no LISTEN
and no dedicated connection: the probe runs through the pool and alone finds new work.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import timedelta

import anyio
import asyncpg
import structlog

from api_sender.schema import notify_channel

from ..db import statements as db
from ..db.connections import RETRYABLE_ERRORS, TRANSIENT_ERRORS, backoff_delay, connect
from ..db.urls import session_left_behind, target_session_attrs
from ..metrics import DB_RECONNECTS
from .availability import Availability
from .sql import QueueStatements
from .waker import Waker

log = structlog.get_logger("worker.listener")

#: What the listener's (re)connect retries with backoff: every database error (any server
#: answer, such as a LISTEN cancelled by statement_timeout or a refused permission) and every
#: connection failure. Only a cancel of the listener itself (shutdown) ends its loop.
SETUP_ERRORS: tuple[type[BaseException], ...] = (*RETRYABLE_ERRORS, asyncpg.PostgresError)


class Dispatcher:
    """Wakes each queue's poller when its work may be due."""

    def __init__(
        self,
        url: str,
        schema: str,
        sql: QueueStatements,
        wakers: Mapping[str, Waker],
        *,
        poll_interval: float,
        stale_seconds: float,
        on_rescue_due: Callable[[], None],
        on_prune_due: Callable[[], None],
        min_retention_seconds: float,
        extra_channels: Mapping[str, Callable[[str], None]] | None = None,
        availability: Availability | None = None,
        poll_through: asyncpg.Pool | None = None,
        on_listening: Callable[[], None] | None = None,
    ) -> None:
        self._availability = availability or Availability()
        self._url = url
        #: What the URL asks of its server (read-write: leave one that turns read-only).
        self._attrs = target_session_attrs(url)
        #: LISTEN_MODE=poll: the pool the probe runs through (no LISTEN at all).
        self._poll_through = poll_through
        self._channel = notify_channel(schema)
        self._sql = sql
        self._wakers = dict(wakers)
        self._queues = list(self._wakers)
        self._poll_interval = poll_interval
        self._stale_seconds = stale_seconds
        self._on_rescue_due = on_rescue_due
        self._on_prune_due = on_prune_due
        self._min_retention = min_retention_seconds
        self._extra = dict(extra_channels or {})
        #: Told each time LISTEN is established: notifications sent before were missed.
        self._on_listening = on_listening
        #: True while LISTEN is established (poll mode: while the probe answers); read by /readyz.
        self.listening = False
        #: The last error that kept the listener (or, poll mode, the probe) from working, until
        #: it works again: the reason /readyz gives with "listener not connected".
        self.problem: str | None = None
        #: Set the first time LISTEN is established.
        self.first_listen = anyio.Event()
        self._lost = anyio.Event()
        self._kick = anyio.Event()

    def _on_notify(self, _conn: object, _pid: int, channel: str, payload: str) -> None:
        if channel == self._channel:
            if not payload:
                # A job due later was sent: probe again to learn the new next due time.
                self._kick.set()
                return
            waker = self._wakers.get(payload)
            if waker is not None:
                waker.wake()
            return
        handler = self._extra.get(channel)
        if handler is not None:
            handler(payload)

    def _on_termination(self, _conn: object) -> None:
        self.listening = False
        self._lost.set()
        self._kick.set()

    def wake_all(self) -> None:
        """Wake every poller (after a reconnect: notifications may have been missed)."""
        for waker in self._wakers.values():
            waker.wake()

    @property
    def polls(self) -> bool:
        """Whether this dispatcher only polls (LISTEN_MODE=poll)."""
        return self._poll_through is not None

    async def run(self) -> None:
        """Keep a listening connection and probe every poll interval, until cancelled."""
        if self._poll_through is not None:
            await self._poll_only(self._poll_through)
            return
        attempt = 0
        while True:
            conn: asyncpg.Connection | None = None
            try:
                try:
                    conn = await self._listen()
                except SETUP_ERRORS as exc:
                    # Whatever the server answers to the set-up (a connection refused or lost,
                    # a LISTEN cancelled by statement_timeout, a permission or configuration
                    # error of the role): retried, so no setting or row makes the worker exit;
                    # /readyz says why meanwhile (see ``problem``).
                    event = (
                        "listener.lost" if isinstance(exc, TRANSIENT_ERRORS) else "listener.failed"
                    )
                    await self._back_off(event, exc, attempt)
                    attempt += 1
                    continue
                self.listening = True
                self.problem = None
                self.first_listen.set()
                if attempt:
                    DB_RECONNECTS.labels("listener").inc()
                    log.info("listener.reconnected", attempts=attempt)
                attempt = 0
                # Anything sent while we were not listening is found by polling now.
                self.wake_all()
                if self._on_listening is not None:
                    self._on_listening()
                await self._probe_loop(conn)
            except TRANSIENT_ERRORS as exc:
                await self._back_off("listener.lost", exc, attempt)
                attempt += 1
            finally:
                self.listening = False
                if conn is not None and not conn.is_closed():
                    conn.terminate()

    async def _listen(self) -> asyncpg.Connection:
        """A new dedicated connection listening on every channel (closed again if any step
        fails)."""
        conn = await connect(
            self._url, server_settings={"application_name": "chassis-worker listener"}
        )
        try:
            self._lost = anyio.Event()
            conn.add_termination_listener(self._on_termination)
            for channel in (self._channel, *self._extra):
                await conn.add_listener(channel, self._on_notify)
        except BaseException:
            conn.terminate()
            raise
        return conn

    async def _poll_only(self, pool: asyncpg.Pool) -> None:
        """LISTEN_MODE=poll: probe through the pool every poll interval, until cancelled."""
        self.first_listen.set()
        attempt = 0
        while True:
            try:
                await self._probe_loop(pool)
            except TRANSIENT_ERRORS as exc:
                await self._back_off(
                    "listener.probe_lost", exc, attempt, cap=min(5.0, self._poll_interval)
                )
                attempt += 1

    async def _back_off(
        self, event: str, exc: BaseException, attempt: int, *, cap: float = 5.0
    ) -> None:
        """The listener failed (attempt ``attempt`` in a row): not listening (and, when the
        database was lost, not available); log ``event`` and wait a jittered backoff before the
        next try."""
        self.listening = False
        if isinstance(exc, TRANSIENT_ERRORS):
            self._availability.lost()
        error = f"{type(exc).__name__}: {exc}"
        self.problem = error
        delay = backoff_delay(attempt, cap=cap)
        log.warning(event, error=error, retry_in=round(delay, 2))
        await anyio.sleep(delay)

    async def _probe_loop(self, conn: asyncpg.Connection | asyncpg.Pool) -> None:
        failures = 0
        while True:
            try:
                with anyio.fail_after(max(5.0, self._poll_interval * 2)):
                    row = await db.fetchrow(
                        conn,
                        self._sql.probe,
                        queues=self._queues,
                        stale_seconds=self._stale_seconds,
                        min_retention=self._min_retention,
                    )
            except TRANSIENT_ERRORS:
                raise
            except RETRYABLE_ERRORS as exc:
                # Cancelled (statement_timeout) or rolled back (deadlock): the connection and
                # its LISTEN are fine; probe again after a pause.
                delay = backoff_delay(failures, cap=self._poll_interval)
                failures += 1
                log.warning(
                    "listener.probe_failed",
                    error=f"{type(exc).__name__}: {exc}",
                    retry_in=round(delay, 2),
                )
                await anyio.sleep(delay)
                continue
            failures = 0
            assert row is not None
            if self.polls and not self.listening:
                self.listening = True
                self.problem = None
                # Back after a loss: anything sent meanwhile is due now.
                self.wake_all()
            self._availability.answered()
            for queue in row["due"]:
                self._wakers[queue].wake()
            if row["rescue"]:
                self._on_rescue_due()
            if row["prunable"]:
                self._on_prune_due()
            sleep = self._poll_interval
            next_due: timedelta | None = row["next_due_in"]
            if next_due is not None:
                sleep = min(sleep, max(0.0, next_due.total_seconds()) + 0.005)
            with anyio.move_on_after(sleep):
                await self._kick.wait()
            self._kick = anyio.Event()
            if self._lost.is_set():
                raise asyncpg.ConnectionDoesNotExistError("listener connection closed")
            if isinstance(conn, asyncpg.Connection) and session_left_behind(
                self._attrs, conn.get_settings()
            ):
                # A demoted primary: LISTEN there would hear no send, and its probe would read
                # a server the writes left. Reconnect; target_session_attrs finds the new one.
                raise asyncpg.ConnectionDoesNotExistError(
                    f"the listener's server is no longer {self._attrs}; reconnecting"
                )
