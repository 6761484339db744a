"""The narrow driver protocol the producers run their operations through.

A driver does two things: :meth:`~AsyncDriver.execute` runs one :class:`~api_sender.operation.Step`
(the query rendered for its schema and placeholder style, the values bound by name) and returns
its rows; :meth:`~AsyncDriver.scope` gives the context one operation runs in (a connection from a
pool, a transaction or savepoint for an atomic operation), or ``None`` when it runs as is. The
runners :func:`run_async` and :func:`run_sync` drive an :class:`~api_sender.operation.Op` through
one, so every operation is written once for every driver.

The protocol is :mod:`api_sender.drivers.base`. Implementations: asyncpg
(:mod:`api_sender.drivers.asyncpg`), psycopg 3 sync and async (:mod:`api_sender.drivers.psycopg`),
SQLAlchemy Core and ORM, sync and async (:mod:`api_sender.drivers.sqlalchemy`) and Django
(:mod:`api_sender.drivers.django`). :func:`async_driver_for` and :func:`sync_driver_for` pick
one for a caller's ``connection=`` by the type's module, importing a driver library only when
the connection's own type shows it is already imported: ``import api_sender`` needs asyncpg only.
"""

from __future__ import annotations

from typing import TypeVar, cast

import asyncpg

from .drivers.asyncpg import AsyncpgDriver
from .drivers.base import AsyncDriver, SyncDriver, what
from .operation import Op

__all__ = [
    "ASYNC_ACCEPTED",
    "SYNC_ACCEPTED",
    "AsyncDriver",
    "AsyncpgDriver",
    "SyncDriver",
    "async_driver_for",
    "roots",
    "run_async",
    "run_sync",
    "sync_driver_for",
]

T = TypeVar("T")

#: What ``connection=`` accepts, by sender (for the TypeError of anything else).
ASYNC_ACCEPTED = (
    "an asyncpg Connection, a psycopg 3 AsyncConnection, or a SQLAlchemy AsyncConnection or "
    "AsyncSession (on asyncpg or psycopg)"
)
SYNC_ACCEPTED = (
    "a psycopg 3 Connection, a SQLAlchemy Connection or Session (on psycopg), or Django's "
    "django.db.connection (the postgresql backend on psycopg 3)"
)


async def run_async(driver: AsyncDriver, op: Op[T]) -> T:
    """Run ``op`` on ``driver``: each step executed, its rows fed back; the op's result."""
    try:
        scope = driver.scope(op.atomic)
        if scope is None:
            return await _drive_async(driver, op)
        async with scope as inner:
            return await _drive_async(inner, op)
    except Exception as exc:
        raise op.failed(exc)  # noqa: B904 (the op's own error, or exc as it was)


async def _drive_async(driver: AsyncDriver, op: Op[T]) -> T:
    step = op.start()
    while step is not None:
        step = op.send(await driver.execute(step))
    return op.result()


def run_sync(driver: SyncDriver, op: Op[T]) -> T:
    """:func:`run_async` for a synchronous driver."""
    try:
        scope = driver.scope(op.atomic)
        if scope is None:
            return _drive_sync(driver, op)
        with scope as inner:
            return _drive_sync(inner, op)
    except Exception as exc:
        raise op.failed(exc)  # noqa: B904 (the op's own error, or exc as it was)


def _drive_sync(driver: SyncDriver, op: Op[T]) -> T:
    step = op.start()
    while step is not None:
        step = op.send(driver.execute(step))
    return op.result()


def roots(connection: object) -> set[str]:
    """The top-level packages of the classes a connection's type is made of."""
    return {cls.__module__.partition(".")[0] for cls in type(connection).__mro__}


def async_driver_for(connection: object, schema: str) -> AsyncDriver:
    """The driver for a caller's async ``connection=``; ``TypeError`` naming what is accepted."""
    found = roots(connection)
    if "asyncpg" in found:
        return AsyncpgDriver(cast("asyncpg.Connection", connection), schema)
    if "psycopg" in found:
        from .drivers import psycopg

        return psycopg.async_driver(connection, schema, ASYNC_ACCEPTED)
    if "sqlalchemy" in found:
        from .drivers import sqlalchemy

        return sqlalchemy.async_driver(connection, schema, ASYNC_ACCEPTED)
    raise TypeError(_refusal(connection, found, ASYNC_ACCEPTED))


def sync_driver_for(connection: object, schema: str) -> SyncDriver:
    """The driver for a caller's sync ``connection=``; ``TypeError`` naming what is accepted."""
    found = roots(connection)
    if "psycopg" in found:
        from .drivers import psycopg

        return psycopg.sync_driver(connection, schema, SYNC_ACCEPTED)
    if "sqlalchemy" in found:
        from .drivers import sqlalchemy

        return sqlalchemy.sync_driver(connection, schema, SYNC_ACCEPTED)
    if "django" in found:
        from .drivers import django

        return django.sync_driver(connection, schema, SYNC_ACCEPTED)
    raise TypeError(_refusal(connection, found, SYNC_ACCEPTED))


def _refusal(connection: object, found: set[str], accepted: str) -> str:
    if "psycopg2" in found:
        return f"psycopg2 is not supported (got {what(connection)}); connection= takes {accepted}"
    if "asyncpg" in found:
        return f"an asyncpg connection is async: use api_sender.Sender (got {what(connection)})"
    return f"connection= takes {accepted}, not {what(connection)}"
