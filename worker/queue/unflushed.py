"""Completions committed without waiting for the WAL flush, kept until the server flushed them.

A completion (alone, or riding the next claim) commits with ``synchronous_commit`` off, as
claims do: the fetcher's next claim starts one WAL flush sooner, which is most of what a drain
waits for. Until its WAL is on disk a crash of the server can undo such a commit, and the job
would be back in ``active`` under this worker, which lives on and would leave it there until
its expiry. So every batch written that way is kept here, with its fence, until the server
reports its WAL flushed past the batch's commit; if the server may have lost it meanwhile, the
batch is written again, waiting for the disk. A completion already written matches no row the
second time (it is no longer active), so writing again changes nothing but what was lost.

How "may have lost it" is known: a crash, a restart or a failover ends every session of the
server. A watch connection of its own (on the session URL: the server itself, never a pooler)
is open before any batch is written lazily, and a batch counts as safe only once that same
session, still open, has seen the WAL flushed past a point taken after the batch committed. A
batch written while no watch session was open, or whose session ended before its flush was
seen, is written again. The watch reads two WAL positions every ``CHECK_INTERVAL`` while
batches wait, and nothing while none do (an idle worker still writes and reads nothing).

Completions wait for the disk as before while no watch session is open, or when the server
replicates synchronously (``synchronous_standby_names`` set: contract section 12 promises that
an acknowledged outcome survives a failover, and a local flush is not a standby's).

What a crash of the server can then repeat: nothing while this worker lives. If the worker dies
with the server, the completions it had not seen flushed (about ``3 x wal_writer_delay`` of
them, 600 ms at the default) are lost with it, and those jobs are rescued and run again, as
the jobs of claims lost in the same crash are: at least once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import asyncpg
import structlog

from ..db import statements as db
from ..db.connections import RETRYABLE_ERRORS, backoff_delay, connect
from .store import Fence, JobStore

if TYPE_CHECKING:
    from .jobs import ClaimedJob

log = structlog.get_logger("worker.queue")

#: How often the WAL positions are read while lazily written batches wait (seconds).
CHECK_INTERVAL = 0.05


@dataclass(slots=True)
class _Batch:
    fence: Fence
    #: The watch session open when the batch was sent (0: none).
    session: int
    #: Order of arrival: a check covers only the batches that arrived before it was sent.
    seq: int
    #: A WAL position past the batch's commit; safe once the flush has reached it.
    cover: int | None = None


class UnflushedCompletions:
    """The lazily committed completions of this process, until the server has flushed them."""

    def __init__(
        self,
        session_url: str,
        store: JobStore,
        *,
        check_interval: float = CHECK_INTERVAL,
    ) -> None:
        self._url = session_url
        self._store = store
        self._interval = check_interval
        self._conn: asyncpg.Connection | None = None
        #: The open watch session's number (0: none open); every new session gets a new one.
        self._session = 0
        self._sessions = 0
        #: The server replicates synchronously: completions wait for the disk.
        self._replicated = False
        self._batches: deque[_Batch] = deque()
        self._seq = 0
        self._arrived = anyio.Event()
        self._emptied = anyio.Event()
        self._emptied.set()

    def session(self) -> int:
        """The watch session to write a batch lazily under, or 0: write it waiting for the disk.
        Asked just before the write is sent."""
        if self._replicated or self._conn is None or self._conn.is_closed():
            return 0
        return self._session

    def written(self, session: int, jobs: list[ClaimedJob]) -> None:
        """``jobs`` were committed lazily, the write sent under ``session`` (not 0)."""
        if not jobs or not session:
            return
        self._add(Fence.of(jobs), session)

    def __len__(self) -> int:
        """How many completions wait for their flush to be seen."""
        return sum(len(batch.fence.ids) for batch in self._batches)

    async def settled(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until every lazily written completion is known to
        be on disk or written again; ``False`` if some still wait (logged)."""
        with anyio.move_on_after(timeout):
            await self._emptied.wait()
        if self._batches:
            log.warning(
                "job.completions_unconfirmed",
                jobs=len(self),
                hint="committed without waiting for the disk and not yet seen flushed; a crash "
                "of the server now would make these jobs run again once rescued",
            )
            return False
        return True

    def _add(self, fence: Fence, session: int) -> None:
        self._batches.append(_Batch(fence, session, self._seq))
        self._seq += 1
        if self._emptied.is_set():
            self._emptied = anyio.Event()
        self._arrived.set()

    async def run(self) -> None:
        """Keep a watch session open and settle the waiting batches, until cancelled."""
        attempt = 0
        try:
            while True:
                try:
                    if self._conn is None or self._conn.is_closed():
                        await self._open()
                    if not self._batches:
                        self._emptied.set()
                        await self._arrived.wait()
                        self._arrived = anyio.Event()
                        continue
                    await anyio.sleep(self._interval)
                    if self._conn is None or self._conn.is_closed():
                        continue  # ended meanwhile: open the next session first
                    await self._check()
                    attempt = 0
                except (*RETRYABLE_ERRORS, asyncpg.PostgresError, _WatchLost) as exc:
                    await self._close()
                    delay = backoff_delay(attempt)
                    attempt += 1
                    log.warning(
                        "job.flush_watch_failed",
                        error=f"{type(exc).__name__}: {exc}",
                        waiting=len(self),
                        retry_in=round(delay, 2),
                    )
                    await anyio.sleep(delay)
        finally:
            with anyio.CancelScope(shield=True):
                await self._close()

    async def _open(self) -> None:
        conn = await connect(self._url)
        try:
            row = await db.fetchrow(conn, self._store.sql.wal_position)
        except BaseException:
            await conn.close(timeout=2)
            raise
        if row["read_only"]:
            await conn.close(timeout=2)
            raise _WatchLost("the watch session's server is read-only")
        # A session that ends (the server crashed, restarted or failed over) wakes the loop
        # even while no batch waits, so the next session is open before the next write.
        conn.add_termination_listener(lambda _conn: self._arrived.set())
        self._conn = conn
        self._sessions += 1
        self._session = self._sessions
        self._replicated = bool(row["replicated"])

    async def _close(self) -> None:
        conn, self._conn, self._session = self._conn, None, 0
        if conn is not None and not conn.is_closed():
            try:
                await conn.close(timeout=2)
            except Exception:  # the session is being given up anyway
                conn.terminate()

    async def _check(self) -> None:
        """One look at the WAL: give each batch sent before it a cover, drop the flushed ones,
        and write again those whose session ended (any batch, however old)."""
        assert self._conn is not None
        session, mark = self._session, self._seq
        row = await db.fetchrow(self._conn, self._store.sql.wal_position)
        if row["read_only"]:
            raise _WatchLost("the watch session's server turned read-only")
        self._replicated = bool(row["replicated"])
        inserted, flushed = row["inserted"], row["flushed"]
        again: list[_Batch] = []
        kept: deque[_Batch] = deque()
        for batch in self._batches:
            if batch.session != session:
                again.append(batch)
                continue
            if batch.cover is None and batch.seq < mark:
                batch.cover = inserted
            if batch.cover is None or batch.cover > flushed:
                kept.append(batch)
        self._batches = kept
        if again:
            await self._write_again(again, session)
        if not self._batches:
            self._emptied.set()

    async def _write_again(self, batches: list[_Batch], session: int) -> None:
        """Write completions whose lazy commit the server may have lost, waiting for the disk.
        They stay kept (under ``session``) until that write is seen flushed too: a write that
        matched nothing wrote no WAL, and so flushed nothing."""
        fence = batches[0].fence
        for batch in batches[1:]:
            fence = fence + batch.fence
        try:
            matched = await self._store.complete_again(fence)
        except BaseException:
            for batch in batches:
                batch.session = 0
            self._batches.extendleft(reversed(batches))
            raise
        log.info(
            "job.completions_written_again",
            jobs=len(fence.ids),
            restored=matched,
            hint="their first commit (not waiting for the disk) may have been lost with the "
            "server's session; the ones it had lost are completed again",
        )
        self._add(fence, session)


class _WatchLost(Exception):
    """The watch session landed on (or stayed on) a server that cannot take writes."""
