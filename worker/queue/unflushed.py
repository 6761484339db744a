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
server. A watch connection of its own (on the session URL: the server itself, never a pooler;
a value set on its session and read back by every check proves no pooler swapped it) is open
before any batch is written lazily, and a batch counts as safe only once that same session,
still open, has seen the WAL flushed past a point taken after the batch committed. A batch
whose session ended before its flush was seen is written again at once through the pool, and
kept until a session sees that write flushed. A write whose answer never came (the connection
broke) is kept as if it had committed. The watch reads two WAL positions every
``CHECK_INTERVAL`` while batches wait, and nothing while none do (an idle worker still writes
and reads nothing).

Completions wait for the disk as before while no watch session is open or the last check is
older than ``FRESH_FOR`` (a watch that stopped answering), while ``MAX_KEPT`` wait here, for
good on a server that does not let the role read its WAL positions, and whenever the server
replicates synchronously (the statement itself looks at ``synchronous_standby_names``: contract
section 12 promises that an acknowledged outcome survives a failover, and a local flush is not
a standby's).

What a crash of the server can then repeat: nothing while this worker lives. If the worker dies
with the server, the completions it had not seen flushed (about ``3 x wal_writer_delay`` of
them, 600 ms at the default) are lost with it, and those jobs are rescued and run again, as
the jobs of claims lost in the same crash are: at least once.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import asyncpg
import structlog

from ..db import statements as db
from ..db.connections import RETRYABLE_ERRORS, backoff_delay, connect
from .store import Fence, JobStore, PackedFence

if TYPE_CHECKING:
    from .jobs import ClaimedJob

log = structlog.get_logger("worker.queue")

#: How often the WAL positions are read while lazily written batches wait (seconds).
CHECK_INTERVAL = 0.05
#: How long one read of the WAL positions may take before the watch session is given up
#: (a half-open connection never reports its end).
CHECK_TIMEOUT = 2.0
#: Completions are written lazily only while the watch has answered this recently (seconds)
#: and keeps fewer than MAX_KEPT of them: a watch that stopped answering makes them wait for
#: the disk again instead of piling up here.
FRESH_FOR = 1.0
MAX_KEPT = 100_000
#: WAL page and the headers at its start (short; long at a segment's start): an insert
#: position just past a header is the page's first byte for a record that ended there.
_WAL_PAGE = 8192
_PAGE_HEADERS = (24, 40)
#: What a server that cannot report its WAL positions answers (Aurora, say, or a role denied the
#: functions): the watch is given up for good and every completion waits for the disk.
_UNAVAILABLE = (
    asyncpg.FeatureNotSupportedError,
    asyncpg.InsufficientPrivilegeError,
    asyncpg.UndefinedFunctionError,
)


@dataclass(slots=True)
class _Batch:
    fence: PackedFence
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
        #: A value set on the watch session alone: a pooler that handed the check another
        #: server session (which a crash would not end) is seen at once.
        self._token = ""
        self._answered_at = -FRESH_FOR
        self._opened_at = -FRESH_FOR
        #: The server cannot report its WAL positions: every completion waits for the disk.
        self._disabled = False
        self._batches: deque[_Batch] = deque()
        self._kept = 0
        self._seq = 0
        self._arrived = anyio.Event()
        self._emptied = anyio.Event()
        self._emptied.set()

    def session(self) -> int:
        """The watch session to write a batch lazily under, or 0: write it waiting for the disk.
        Asked just before the write is sent."""
        if self._disabled or self._conn is None or self._conn.is_closed():
            return 0
        if self._kept >= MAX_KEPT or time.monotonic() - self._answered_at > FRESH_FOR:
            self._arrived.set()  # look again now; lazy writes resume once it answers
            return 0
        return self._session

    def written(self, session: int, jobs: list[ClaimedJob]) -> None:
        """``jobs`` were committed lazily under ``session`` (not 0), or may have been: a write
        whose outcome is unknown (the connection broke before its answer) is kept as well, since
        a write made again later may match nothing and so flush nothing."""
        if not jobs or not session:
            return
        self._add(PackedFence.of(Fence.of(jobs)), session)

    def __len__(self) -> int:
        """How many completions wait for their flush to be seen."""
        return self._kept

    async def settled(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until every lazily written completion is known to
        be on disk or written again; ``False`` if some still wait (logged)."""
        with anyio.move_on_after(timeout):
            while self._batches:
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

    def _add(self, fence: PackedFence, session: int) -> None:
        self._batches.append(_Batch(fence, session, self._seq))
        self._seq += 1
        self._kept += len(fence)
        if self._emptied.is_set():
            self._emptied = anyio.Event()
        self._arrived.set()

    def _settle(self) -> None:
        if not self._batches:
            self._emptied.set()

    async def run(self) -> None:
        """Keep a watch session open and settle the waiting batches, until cancelled."""
        attempt = 0
        try:
            while not self._disabled:
                try:
                    if self._conn is None or self._conn.is_closed():
                        if time.monotonic() - self._opened_at < FRESH_FOR:
                            # The last session ended as soon as it opened: do not spin.
                            await anyio.sleep(backoff_delay(attempt))
                            attempt += 1
                        await self._open()
                    if self._batches:
                        await anyio.sleep(self._interval)
                    elif time.monotonic() - self._answered_at <= FRESH_FOR:
                        self._settle()
                        await self._arrived.wait()
                        self._arrived = anyio.Event()
                        continue
                    if self._conn is None or self._conn.is_closed():
                        continue  # ended meanwhile: open the next session first
                    await self._check()
                    attempt = 0
                except _UNAVAILABLE as exc:
                    await self._give_up(exc)
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
                    # Whatever the server may have lost is completed again through the pool
                    # now, not only once a watch session is back; kept until one sees it flushed.
                    # Once: batches already kept under no session were written again before.
                    await self._write_again(self._take_under_a_session(), 0)
                    await anyio.sleep(delay)
        finally:
            with anyio.CancelScope(shield=True):
                await self._close()

    async def _open(self) -> None:
        self._opened_at = time.monotonic()
        conn = await connect(self._url)
        token = uuid.uuid4().hex
        try:
            await db.execute(conn, self._store.sql.flush_watch, token=token, timeout=CHECK_TIMEOUT)
            row = await db.fetchrow(conn, self._store.sql.wal_position, timeout=CHECK_TIMEOUT)
        except BaseException:
            conn.terminate()
            raise
        if row["read_only"]:
            conn.terminate()
            raise _WatchLost("the watch session's server is read-only")
        # A session that ends (the server crashed, restarted or failed over) wakes the loop
        # even while no batch waits, so the next session is open before the next write.
        conn.add_termination_listener(lambda _conn: self._arrived.set())
        self._conn = conn
        self._token = token
        self._sessions += 1
        self._session = self._sessions
        self._answered_at = time.monotonic()

    async def _close(self) -> None:
        conn, self._conn, self._session = self._conn, None, 0
        if conn is not None and not conn.is_closed():
            try:
                await conn.close(timeout=2)
            except Exception:  # the session is being given up anyway
                conn.terminate()

    async def _give_up(self, exc: BaseException) -> None:
        """The server cannot report its WAL positions: stop writing lazily, for good, and
        complete what waits here once more, through the pool."""
        self._disabled = True
        await self._close()
        log.warning(
            "job.flush_watch_unavailable",
            error=f"{type(exc).__name__}: {exc}",
            hint="completions now wait for the disk (pg_current_wal_flush_lsn() is not available"
            " to this role on this server)",
        )
        await self._write_again(self._take_all(), 0)
        self._batches.clear()
        self._kept = 0
        self._settle()

    def _take_all(self) -> list[_Batch]:
        """Remove and return every batch kept."""
        taken, self._batches, self._kept = list(self._batches), deque(), 0
        return taken

    def _take_under_a_session(self) -> list[_Batch]:
        """Remove and return the batches kept under a watch session (not 0)."""
        taken = [b for b in self._batches if b.session]
        if taken:
            self._batches = deque(b for b in self._batches if not b.session)
            self._kept -= sum(len(b.fence) for b in taken)
        return taken

    async def _check(self) -> None:
        """One look at the WAL: give each batch sent before it a cover, drop the flushed ones,
        and write again those whose session ended (any batch, however old)."""
        assert self._conn is not None
        session, mark = self._session, self._seq
        row = await db.fetchrow(self._conn, self._store.sql.wal_position, timeout=CHECK_TIMEOUT)
        if row["read_only"]:
            raise _WatchLost("the watch session's server turned read-only")
        if row["token"] != self._token:
            raise _WatchLost("the watch's check ran on another server session (a pooler?)")
        self._answered_at = time.monotonic()
        inserted, flushed = _record_end(row["inserted"]), row["flushed"]
        stale: list[_Batch] = []
        kept: deque[_Batch] = deque()
        for batch in self._batches:
            if batch.session != session:
                stale.append(batch)
                continue
            if batch.cover is None and batch.seq < mark:
                batch.cover = inserted
            if batch.cover is None or batch.cover > flushed:
                kept.append(batch)
            else:
                self._kept -= len(batch.fence)
        self._batches = kept
        self._kept -= sum(len(b.fence) for b in stale)
        await self._write_again(stale, session)
        self._settle()

    async def _write_again(self, batches: list[_Batch], session: int) -> None:
        """Write completions whose lazy commit the server may have lost, waiting for the disk,
        batch by batch (each as large as it was written). They are kept again, under
        ``session``, until that write is seen flushed too: a write that matched nothing wrote
        no WAL, and so flushed nothing. A batch the database cannot take now is kept as it was
        (tried again at the next look); one it refuses is given up: its jobs stay active until
        their expiry, then run again."""
        jobs = restored = 0
        for n, batch in enumerate(batches):
            try:
                matched = await self._store.complete_again(batch.fence.unpacked())
            except RETRYABLE_ERRORS as exc:
                for left in batches[n:]:
                    self._add(left.fence, 0)
                log.warning(
                    "job.completions_write_again_failed",
                    jobs=sum(len(b.fence) for b in batches[n:]),
                    error=f"{type(exc).__name__}: {exc}",
                )
                break
            except Exception as exc:
                log.error(
                    "job.completions_write_again_refused",
                    ids=batch.fence.ids.tolist(),
                    error=f"{type(exc).__name__}: {exc}",
                    hint="these jobs stay active until their expiry, then run again",
                )
                continue
            jobs += len(batch.fence)
            restored += matched
            self._add(batch.fence, session)
        if jobs:
            log.info(
                "job.completions_written_again",
                jobs=jobs,
                restored=restored,
                hint="their first commit (not waiting for the disk) may have been lost with the "
                "server's session; the ones it had lost are completed again",
            )


def _record_end(inserted: int) -> int:
    """The WAL position every record inserted so far ends at or before. The insert position
    reads just past a page's header when the last record ended at the page's first byte, and
    the flush then stops at that byte: without this, such a batch would wait for more WAL."""
    offset = inserted % _WAL_PAGE
    return inserted - offset if offset in _PAGE_HEADERS else inserted


class _WatchLost(Exception):
    """The watch session landed on (or stayed on) a server that cannot take writes, or the
    check reached another session than the one opened."""
