"""psycopg 3: a caller's ``Connection``/``AsyncConnection``, and the connection or
``psycopg_pool.ConnectionPool`` a SyncSender sends through."""

from __future__ import annotations

import sys
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import RowMaker

from ..operation import Rows, Step
from .base import AsyncDriver, Bound, SyncDriver, what

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

#: The cursors a row factory is given (sync and async).
Cursors = psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]


def _mapping_rows(cursor: Cursors) -> RowMaker[dict[str, Any]]:
    """Rows as dicts by column name (psycopg's ``dict_row``, with the names read off the result
    itself instead of ``cursor.description``, which builds a Column object per column per
    statement)."""
    result = cursor.pgresult
    if result is None:
        names: list[str] = []
    else:
        encoding = cursor.connection.info.encoding
        names = [(result.fname(i) or b"").decode(encoding) for i in range(result.nfields)]

    def make(values: Sequence[Any]) -> dict[str, Any]:
        return dict(zip(names, values, strict=True))

    return make


def _has_rows(cursor: Cursors) -> bool:
    """Whether the last statement answered rows (fetchall raises otherwise)."""
    result = cursor.pgresult
    return result is not None and result.status == psycopg.pq.ExecStatus.TUPLES_OK


def async_driver(connection: object, schema: str, accepted: str) -> AsyncDriver:
    """The driver of a psycopg ``AsyncConnection``."""
    if isinstance(connection, psycopg.AsyncConnection):
        return AsyncPsycopgDriver(connection, schema)
    raise TypeError(_refusal(connection, accepted))


def sync_driver(connection: object, schema: str, accepted: str) -> SyncDriver:
    """The driver of a psycopg ``Connection``."""
    if isinstance(connection, psycopg.Connection):
        return PsycopgDriver(connection, schema)
    raise TypeError(_refusal(connection, accepted))


def _refusal(connection: object, accepted: str) -> str:
    if isinstance(connection, psycopg.Connection):
        return (
            "a psycopg Connection is synchronous: send through api_sender.SyncSender, or pass "
            "a psycopg AsyncConnection to Sender"
        )
    if isinstance(connection, psycopg.AsyncConnection):
        return (
            "a psycopg AsyncConnection is async: send through api_sender.Sender, or pass a "
            "psycopg Connection to SyncSender"
        )
    return f"connection= takes {accepted}, not {what(connection)}"


def connect(url: str, *, pooled: bool, **kwargs: Any) -> psycopg.Connection[Any]:
    """A SyncSender's own connection: autocommit, and with ``pooled`` no prepared statements
    (``prepare_threshold=None``; psycopg otherwise prepares a query run 5 times, by name)."""
    if pooled:
        kwargs["prepare_threshold"] = None
    return psycopg.connect(url, autocommit=True, **kwargs)


def owned_driver(connection: object, schema: str, refusal: str) -> SyncDriver:
    """The driver of the connection (one operation at a time) or psycopg_pool pool (one
    connection per operation) a SyncSender sends through."""
    if isinstance(connection, psycopg.Connection):
        return PsycopgDriver(connection, schema, lock=threading.RLock())
    if "psycopg_pool" in sys.modules:
        from psycopg_pool import ConnectionPool

        if isinstance(connection, ConnectionPool):
            return PoolDriver(connection, schema)
    raise TypeError(refusal.format(what=what(connection)))


def _own_block(connection: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether an atomic operation on a caller's connection needs a block of its own.

    psycopg's ``transaction()`` makes a savepoint inside an open transaction, and in autocommit
    a transaction of its own; but on an idle connection outside autocommit it would BEGIN and
    COMMIT, committing the caller's work. There the operation's first statement begins the
    caller's (implicit) transaction, which then holds all of it until the caller commits.
    """
    idle = connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    return connection.autocommit or not idle


class PsycopgDriver(Bound):
    """A psycopg ``Connection``: the caller's (its transaction is theirs), or with ``lock`` the
    one a SyncSender owns, where every operation commits on its own."""

    style = "format"

    def __init__(
        self,
        connection: psycopg.Connection[Any],
        schema: str,
        *,
        lock: threading.RLock | None = None,
        alone: bool = False,
    ) -> None:
        super().__init__(schema)
        self.connection = connection
        self._lock = lock
        # A pool's connection, used for one operation of ours and committed after it.
        self._alone = alone
        # The owned connection's one cursor, used under the lock (the caller's: one per call).
        self._cursor: psycopg.Cursor[dict[str, Any]] | None = None

    def execute(self, step: Step) -> Rows:
        text, args = self.bind(step, self._alone or self._autocommitting())
        if self._lock is None:
            with self.connection.cursor(row_factory=_mapping_rows) as cursor:
                cursor.execute(text, args)
                return cursor.fetchall() if _has_rows(cursor) else []
        with self._lock:
            if self._cursor is None or self._cursor.closed:
                self._cursor = self.connection.cursor(row_factory=_mapping_rows)
            owned = self._cursor
            owned.execute(text, args)
            return owned.fetchall() if _has_rows(owned) else []

    def _autocommitting(self) -> bool:
        """Whether this is the owned connection, in autocommit and no transaction (each
        statement then commits alone)."""
        if self._lock is None or not self.connection.autocommit:
            return False
        return self.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE

    def scope(self, atomic: bool) -> AbstractContextManager[SyncDriver] | None:
        if self._lock is not None:
            if not atomic and self.connection.autocommit:
                return self  # the lock, taken for the operation's statements (__enter__)
            return self._owned(atomic)
        return self._transaction() if atomic and _own_block(self.connection) else None

    def __enter__(self) -> SyncDriver:
        assert self._lock is not None
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._lock is not None
        self._lock.release()

    @contextmanager
    def _transaction(self) -> Iterator[SyncDriver]:
        # A transaction, or a savepoint when the connection is already in one.
        with self.connection.transaction():
            yield self

    @contextmanager
    def _owned(self, atomic: bool) -> Iterator[SyncDriver]:
        # One operation at a time on the shared connection (threads of a web app); outside
        # autocommit every operation is a transaction of its own, committed here.
        assert self._lock is not None
        with self._lock:
            if atomic or not self.connection.autocommit:
                with self.connection.transaction():
                    yield self
            else:
                yield self


class PoolDriver(Bound):
    """A ``psycopg_pool.ConnectionPool``: each operation on a connection of its own, committed
    when the operation ends (the pool's ``connection()`` block), as a pool's send should be."""

    style = "format"

    def __init__(self, pool: ConnectionPool[Any], schema: str) -> None:
        super().__init__(schema)
        self._pool = pool

    def execute(self, step: Step) -> Rows:
        with self._checkout(False) as driver:
            return driver.execute(step)

    def scope(self, atomic: bool) -> AbstractContextManager[SyncDriver] | None:
        return self._checkout(atomic)

    @contextmanager
    def _checkout(self, atomic: bool) -> Iterator[SyncDriver]:
        with self._pool.connection() as connection:
            driver = PsycopgDriver(connection, self.schema, alone=not atomic)
            if atomic and connection.autocommit:
                with connection.transaction():
                    yield driver
            else:
                yield driver


class AsyncPsycopgDriver(Bound):
    """A caller's psycopg ``AsyncConnection``; its transaction is the caller's."""

    style = "format"

    def __init__(self, connection: psycopg.AsyncConnection[Any], schema: str) -> None:
        super().__init__(schema)
        self._connection = connection

    async def execute(self, step: Step) -> Rows:
        text, args = self.bind(step)
        async with self._connection.cursor(row_factory=_mapping_rows) as cursor:
            await cursor.execute(text, args)
            return await cursor.fetchall() if _has_rows(cursor) else []

    def scope(self, atomic: bool) -> AbstractAsyncContextManager[AsyncDriver] | None:
        return self._transaction() if atomic and _own_block(self._connection) else None

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncDriver]:
        async with self._connection.transaction():
            yield self
