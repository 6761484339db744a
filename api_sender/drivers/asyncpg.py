"""asyncpg: the Sender's own pool, and a caller's connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, cast

import asyncpg

from ..operation import Rows, Step
from .base import AsyncDriver, Bound

#: How long a connection a Sender keeps at hand stays out of its pool after its last use.
KEEP_SECONDS = 0.1


class AsyncpgDriver(Bound):
    """asyncpg: a pool (each operation on one acquired connection) or a connection.

    On a pool the Sender opened itself (:meth:`keep_connections`), a connection a statement
    ran on is kept at hand for the next operation instead of going back through asyncpg's
    acquire and release (a task and extra loop turns per send). Only a connection that ended
    its statement cleanly (a result or a database error) is kept: open and not in a
    transaction, and only while no operation of this sender waits for a connection of the pool.
    On any other outcome (a cancellation mid-statement, a client-side error) it goes back
    through the pool's own release, which waits out the cancellation and resets or closes it.
    Kept connections return to the pool at most ``KEEP_SECONDS`` after they were kept, so the
    pool's other users (``sender.pool.acquire()``), ``close()`` and the pool's own housekeeping
    see them again.
    """

    def __init__(self, executor: asyncpg.Pool | asyncpg.Connection, schema: str) -> None:
        super().__init__(schema)
        self._executor = executor
        # On a pool every statement runs on a connection in no transaction of the caller's.
        self._alone = isinstance(executor, asyncpg.Pool)
        self._kept: list[Any] | None = None
        self._sweep: asyncio.TimerHandle | None = None
        self._releasing: set[asyncio.Task[None]] = set()
        self._waiting = 0

    def keep_connections(self) -> None:
        """Keep connections at hand between operations (a pool the Sender owns)."""
        assert isinstance(self._executor, asyncpg.Pool)
        self._kept = []

    async def execute(self, step: Step) -> Rows:
        text, args = self.bind(step, self._alone)
        if self._kept is None:
            return cast("Rows", await self._executor.fetch(text, *args))
        conn = await self._take()
        try:
            rows = await conn.fetch(text, *args)
        except asyncpg.PostgresError:
            # The server refused the statement; the connection is as clean as after a success.
            if not self._keep(conn):
                await self._release(conn)
            raise
        except BaseException:
            await self._release(conn)
            raise
        if not self._keep(conn):
            await self._release(conn)
        return cast("Rows", rows)

    def scope(self, atomic: bool) -> AbstractAsyncContextManager[AsyncDriver] | None:
        return self._transaction() if atomic else None

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncDriver]:
        # A transaction, or a savepoint when the connection is already in one.
        if self._kept is not None:
            conn = await self._take()
            try:
                async with conn.transaction():
                    yield AsyncpgDriver(conn, self.schema)
            except asyncpg.PostgresError:
                if not self._keep(conn):
                    await self._release(conn)
                raise
            except BaseException:
                await self._release(conn)
                raise
            if not self._keep(conn):
                await self._release(conn)
        elif isinstance(self._executor, asyncpg.Pool):
            async with self._executor.acquire() as conn, conn.transaction():
                yield AsyncpgDriver(conn, self.schema)
        else:
            async with self._executor.transaction():
                yield self

    async def _take(self) -> Any:
        """A kept connection still open, else one acquired from the pool."""
        assert self._kept is not None
        while self._kept:
            conn = self._kept.pop()
            if _usable(conn):
                return conn
            await self._release(conn)
        # Counted: while an operation of ours waits here, a connection is given back to the
        # pool rather than kept, so the waiter gets it now, not at the next sweep.
        self._waiting += 1
        try:
            return await cast("asyncpg.Pool", self._executor).acquire()
        finally:
            self._waiting -= 1

    def _keep(self, conn: Any) -> bool:
        """Keep ``conn`` for the next operation if it ended clean (else the caller releases it)."""
        assert self._kept is not None
        if self._waiting or not _usable(conn) or conn.is_in_transaction():
            return False
        self._kept.append(conn)
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(KEEP_SECONDS, self._return_kept)
        return True

    async def _release(self, conn: Any) -> None:
        # The pool's own path: waits out a cancellation, rolls back, resets, or terminates.
        await cast("asyncpg.Pool", self._executor).release(conn)

    def _return_kept(self) -> None:
        """Give every kept connection back to the pool (the timer of ``KEEP_SECONDS``)."""
        self._sweep = None
        kept, self._kept = self._kept or [], []
        for conn in kept:
            task = asyncio.get_running_loop().create_task(self._release(conn))
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)

    async def return_kept(self) -> None:
        """Give every kept connection back to the pool now, and wait (before closing it)."""
        if self._kept is None:
            return
        if self._sweep is not None:
            self._sweep.cancel()
        self._return_kept()
        if self._releasing:
            await asyncio.gather(*self._releasing, return_exceptions=True)


def _usable(conn: Any) -> bool:
    """Whether a pool connection is still open (not closed, nor detached by its pool)."""
    try:
        return not conn.is_closed()
    except asyncpg.InterfaceError:
        # Detached: the pool took it back when the connection closed.
        return False
