"""The synchronous producer on psycopg 3, for Django, Flask and scripts (contract section 11).

The same operations as :class:`~api_sender.Sender` (:mod:`api_sender.operations`, the jobs and
queues operations), run by the synchronous runner. psycopg is imported only when a
``SyncSender`` is opened or a psycopg connection is given: ``import api_sender`` needs asyncpg
alone (install the ``psycopg`` extra for this one).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar, Unpack

from . import operations
from .driver import SyncDriver, roots, run_sync, sync_driver_for
from .drivers.base import what
from .jobs import SyncJobsApi
from .operation import Op
from .options import SendKwargs, SendOptions, options_of
from .queues import SyncQueuesApi
from .schema import check_schema_name
from .timers import SyncTimers
from .usage import SyncUsageSink, UsageRetry

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

T = TypeVar("T")

_NOT_PSYCOPG = (
    "SyncSender(...) takes a psycopg 3 Connection or a psycopg_pool ConnectionPool, not {what}; "
    "for SQLAlchemy or Django pass "
    "theirs per call as connection=, or open one with SyncSender.connect(url)"
)


class SyncSender:
    """Enqueues jobs synchronously on psycopg 3, with the methods of :class:`~api_sender.Sender`.

    ``SyncSender(conn)`` sends over an open ``psycopg.Connection`` (thread-safe: one operation
    at a time): each operation commits on its own (autocommit, or a transaction it commits), or
    inside the connection's open transaction as a savepoint. ``SyncSender(pool)`` over a
    ``psycopg_pool.ConnectionPool`` runs each operation on a connection of the pool and commits
    it, for threads sending at once. ``with SyncSender.connect(url) as sender`` opens and closes an
    autocommit connection of its own. ``connection=`` sends inside the caller's transaction on a
    psycopg ``Connection``, a SQLAlchemy ``Connection``/``Session``, or Django's
    ``django.db.connection`` (inside ``transaction.atomic()``).
    """

    def __init__(
        self,
        connection: psycopg.Connection[Any] | ConnectionPool[Any],
        *,
        schema: str = "jobs",
        usage_retry: UsageRetry | None = None,
    ) -> None:
        self.schema = check_schema_name(schema)
        if not {"psycopg", "psycopg_pool"} & roots(connection):
            raise TypeError(_NOT_PSYCOPG.format(what=what(connection)))
        from .drivers.psycopg import owned_driver

        self._connection = connection
        self._driver: SyncDriver = owned_driver(connection, self.schema, _NOT_PSYCOPG)
        self._owns_connection = False
        # Sender's four surfaces (see there), on the synchronous runner.
        self.usage = SyncUsageSink(self, retry=usage_retry)
        self.timers = SyncTimers(self)
        self.jobs = SyncJobsApi(self._driver)
        self.queues = SyncQueuesApi(self._driver)

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        schema: str = "jobs",
        usage_retry: UsageRetry | None = None,
        pooled: bool = False,
        **connect_kwargs: Any,
    ) -> Self:
        """Open a connection of its own (autocommit); use as ``with SyncSender.connect(url)``.

        ``pooled=True`` (behind a transaction-mode pooler such as PgBouncer) sets psycopg's
        ``prepare_threshold=None``, so no named prepared statement is ever made.
        ``connect_kwargs`` go to ``psycopg.connect`` (``connect_timeout``, ``options``, ...).
        """
        check_schema_name(schema)
        from .drivers.psycopg import connect

        connection = connect(url, pooled=pooled, **connect_kwargs)
        sender = cls(connection, schema=schema, usage_retry=usage_retry)
        sender._owns_connection = True
        return sender

    @property
    def connection(self) -> psycopg.Connection[Any] | ConnectionPool[Any]:
        """The connection (or pool) this sender enqueues through."""
        return self._connection

    def run(self, op: Op[T], connection: object | None = None) -> T:
        """Run one operation on the sender's connection, or on the caller's ``connection``."""
        driver = self._driver if connection is None else sync_driver_for(connection, self.schema)
        return run_sync(driver, op)

    def close(self) -> None:
        """Close the connection if this sender opened it."""
        if self._owns_connection:
            self._connection.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def send(
        self,
        queue: str,
        data: Any = None,
        *,
        connection: object | None = None,
        **options: Unpack[SendKwargs],
    ) -> int | None:
        """See :meth:`Sender.send <api_sender.Sender.send>`."""
        return self.send_with(queue, data, options_of(options), connection=connection)

    def send_with(
        self, queue: str, data: Any, options: SendOptions, *, connection: object | None = None
    ) -> int | None:
        """Like :meth:`send`, with the options given as one :class:`SendOptions` value."""
        return self.run(operations.send(self.schema, queue, data, options), connection)

    def send_many(
        self,
        queue: str,
        items: Iterable[Any],
        *,
        singleton_keys: Sequence[str | None] | None = None,
        connection: object | None = None,
        **options: Unpack[SendKwargs],
    ) -> list[int]:
        """See :meth:`Sender.send_many <api_sender.Sender.send_many>`."""
        op = operations.send_many(self.schema, queue, items, options_of(options), singleton_keys)
        return self.run(op, connection)
