"""SQLAlchemy Core and ORM, sync and async, on its asyncpg or psycopg dialect.

Every statement runs through SQLAlchemy's own connection (``exec_driver_sql``), never the DBAPI
connection underneath: SQLAlchemy begins its transaction lazily, at the first statement it runs,
so a statement on the raw connection would run outside (and autocommit on asyncpg). A Session's
connection is the one bound to its current transaction (``session.connection()``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from typing import cast

from sqlalchemy import Connection
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from ..operation import Rows, Step
from ..query import Paramstyle
from .base import AsyncDriver, Bound, SyncDriver, what

#: The DBAPI drivers a SQLAlchemy connection may run on, and their placeholder style.
_STYLES: dict[str, Paramstyle] = {"asyncpg": "dollar", "psycopg": "format"}


def _style(dialect: Dialect, accepted: str) -> Paramstyle:
    if dialect.name != "postgresql" or dialect.driver not in _STYLES:
        driver = f"{dialect.name}+{dialect.driver}"
        hint = " (psycopg2 is not supported)" if dialect.driver == "psycopg2" else ""
        raise TypeError(
            f"a SQLAlchemy connection on {driver} cannot send{hint}; use postgresql+psycopg or "
            f"postgresql+asyncpg: connection= takes {accepted}"
        )
    return _STYLES[dialect.driver]


def async_driver(connection: object, schema: str, accepted: str) -> AsyncDriver:
    """The driver of a SQLAlchemy ``AsyncConnection`` or ``AsyncSession``."""
    if isinstance(connection, AsyncSession):
        bind = connection.bind
        dialect = bind.dialect if bind is not None else None
    elif isinstance(connection, AsyncConnection):
        dialect = connection.dialect
    elif isinstance(connection, Connection | Session):
        raise TypeError(
            f"a SQLAlchemy {type(connection).__name__} is synchronous: send through "
            "api_sender.SyncSender, or pass an AsyncConnection or AsyncSession to Sender"
        )
    else:
        raise TypeError(f"connection= takes {accepted}, not {what(connection)}")
    if dialect is None:
        raise TypeError("this AsyncSession is bound to no engine; bind it to a postgresql one")
    return AsyncSQLAlchemyDriver(connection, schema, _style(dialect, accepted))


def sync_driver(connection: object, schema: str, accepted: str) -> SyncDriver:
    """The driver of a SQLAlchemy ``Connection`` or ``Session``."""
    if isinstance(connection, Session):
        connection = connection.connection()
    if isinstance(connection, Connection):
        return SQLAlchemyDriver(connection, schema, _style(connection.dialect, accepted))
    if isinstance(connection, AsyncConnection | AsyncSession):
        raise TypeError(
            f"a SQLAlchemy {type(connection).__name__} is async: send through "
            "api_sender.Sender, or pass a Connection or Session to SyncSender"
        )
    raise TypeError(f"connection= takes {accepted}, not {what(connection)}")


class SQLAlchemyDriver(Bound):
    """A SQLAlchemy ``Connection``; its (lazily begun) transaction is the caller's."""

    def __init__(self, connection: Connection, schema: str, style: Paramstyle) -> None:
        super().__init__(schema)
        self.style = style
        self._connection = connection

    def execute(self, step: Step) -> Rows:
        text, args = self.bind(step)
        result = self._connection.exec_driver_sql(text, tuple(args))
        return cast("Rows", result.mappings().all()) if result.returns_rows else []

    def scope(self, atomic: bool) -> AbstractContextManager[SyncDriver] | None:
        return self._savepoint() if atomic else None

    @contextmanager
    def _savepoint(self) -> Iterator[SyncDriver]:
        # begin_nested begins the outer transaction first when none is (it stays the caller's).
        with self._connection.begin_nested():
            yield self


class AsyncSQLAlchemyDriver(Bound):
    """A SQLAlchemy ``AsyncConnection`` or ``AsyncSession``; the transaction is the caller's."""

    def __init__(
        self, connection: AsyncConnection | AsyncSession, schema: str, style: Paramstyle
    ) -> None:
        super().__init__(schema)
        self.style = style
        self._connection = connection

    async def _conn(self) -> AsyncConnection:
        if isinstance(self._connection, AsyncSession):
            return await self._connection.connection()
        return self._connection

    async def execute(self, step: Step) -> Rows:
        text, args = self.bind(step)
        result = await (await self._conn()).exec_driver_sql(text, tuple(args))
        return cast("Rows", result.mappings().all()) if result.returns_rows else []

    def scope(self, atomic: bool) -> AbstractAsyncContextManager[AsyncDriver] | None:
        return self._savepoint() if atomic else None

    @asynccontextmanager
    async def _savepoint(self) -> AsyncIterator[AsyncDriver]:
        async with (await self._conn()).begin_nested():
            yield self
