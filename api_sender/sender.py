"""The producer: enqueue jobs into the durable queue, alone or inside the caller's transaction."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar, Unpack

import asyncpg

from . import operations
from .driver import AsyncpgDriver, async_driver_for, run_async
from .jobs import JobsApi
from .operation import Op
from .options import SendKwargs, SendOptions, options_of
from .pool import create_pool
from .queues import QueuesApi
from .schema import check_schema_name
from .timers import Timers
from .usage import UsageRetry, UsageSink

T = TypeVar("T")


class Sender:
    """Enqueues jobs. Runs no DDL: it needs only INSERT/SELECT/UPDATE on the queue tables.

    Build one over an existing pool with ``Sender(pool)`` or let it own a pool with
    ``async with Sender.connect(url) as sender``. Every method runs an operation of
    :mod:`api_sender.operations` (the ones :class:`~api_sender.SyncSender` runs too) on the pool,
    or with ``connection=`` inside the caller's transaction on an asyncpg connection, a psycopg 3
    ``AsyncConnection`` or a SQLAlchemy ``AsyncConnection``/``AsyncSession``.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        schema: str = "jobs",
        usage_retry: UsageRetry | None = None,
    ) -> None:
        self.schema = check_schema_name(schema)
        self._pool = pool
        self._driver = AsyncpgDriver(pool, self.schema)
        self._owns_pool = False
        #: Durable usage emission (``sender.usage.emit(event)``); never raises into the caller.
        self.usage = UsageSink(self, retry=usage_retry)
        #: One-off timers, keyed or not (``sender.timers.schedule(...)``).
        self.timers = Timers(self)
        #: Look at jobs and act on them (``sender.jobs.retry([...])``), each action audited.
        self.jobs = JobsApi(self._driver)
        #: Pause, resume and purge queues (``sender.queues.pause("q")``), each action audited.
        self.queues = QueuesApi(self._driver)

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        schema: str = "jobs",
        min_size: int = 1,
        max_size: int = 10,
        usage_retry: UsageRetry | None = None,
        pooled: bool = False,
    ) -> _Connecting:
        """Open a pool of its own; use as ``async with Sender.connect(url) as sender``.

        ``pooled=True`` (behind a transaction-mode pooler such as PgBouncer) turns asyncpg's
        statement cache off, so no named prepared statement is ever made. Between sends the
        sender keeps the connection it last used at hand (back in the pool within 0.1 s of
        its last use, or at once when another send of this sender waits for a connection).
        """
        return _Connecting(cls, url, schema, min_size, max_size, usage_retry, pooled)

    @property
    def pool(self) -> asyncpg.Pool:
        """The pool this sender enqueues through."""
        return self._pool

    async def run(self, op: Op[T], connection: object | None = None) -> T:
        """Run one operation on the pool, or on the caller's ``connection``."""
        driver = self._driver if connection is None else async_driver_for(connection, self.schema)
        return await run_async(driver, op)

    async def close(self) -> None:
        """Close the pool if this sender opened it."""
        if self._owns_pool:
            await self._driver.return_kept()
            await self._pool.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def send(
        self,
        queue: str,
        data: Any = None,
        *,
        connection: object | None = None,
        **options: Unpack[SendKwargs],
    ) -> int | None:
        """Enqueue one job and return its id.

        ``data`` is anything JSON can carry; a pydantic model is sent as
        ``model.model_dump(mode="json")``. The options (:class:`SendOptions`): ``start_after``
        (seconds or an aware datetime), ``singleton_key``, ``priority`` and the queue-setting
        overrides ``retry_limit``, ``retry_delay``, ``retry_backoff``, ``expire_in_seconds``.
        Returns ``None`` when the queue's policy refuses a second job for ``singleton_key``
        (``short``/``stately`` queues). With ``connection=``, the job exists if and only if the
        caller's transaction commits. Raises :class:`QueueNotFound` for an unknown queue and
        :class:`InvalidJob` naming the field for invalid input.
        """
        return await self.send_with(queue, data, options_of(options), connection=connection)

    async def send_with(
        self, queue: str, data: Any, options: SendOptions, *, connection: object | None = None
    ) -> int | None:
        """Like :meth:`send`, with the options given as one :class:`SendOptions` value."""
        return await self.run(operations.send(self.schema, queue, data, options), connection)

    async def send_many(
        self,
        queue: str,
        items: Iterable[Any],
        *,
        singleton_keys: Sequence[str | None] | None = None,
        connection: object | None = None,
        **options: Unpack[SendKwargs],
    ) -> list[int]:
        """Enqueue one job per item in a single statement and return their ids in order.

        Every job shares the options given (as for :meth:`send`); ``singleton_keys`` (one entry
        per item, ``None`` for "the shared ``singleton_key``") gives each job its own key. The
        statement is atomic: every job is stored or none. On ``short``/``stately`` queues a
        refused key is left out of the returned ids. An item may be a pydantic model, sent as
        its ``model_dump(mode="json")``.
        """
        return await self.send_many_with(
            queue,
            items,
            options_of(options),
            singleton_keys=singleton_keys,
            connection=connection,
        )

    async def send_many_with(
        self,
        queue: str,
        items: Iterable[Any],
        options: SendOptions,
        *,
        singleton_keys: Sequence[str | None] | None = None,
        connection: object | None = None,
    ) -> list[int]:
        """Like :meth:`send_many`, with the shared options given as one :class:`SendOptions`."""
        op = operations.send_many(self.schema, queue, items, options, singleton_keys)
        return await self.run(op, connection)


class _Connecting:
    """The awaitable context manager ``Sender.connect`` returns."""

    def __init__(
        self,
        cls: type[Sender],
        url: str,
        schema: str,
        min_size: int,
        max_size: int,
        usage_retry: UsageRetry | None,
        pooled: bool,
    ) -> None:
        self._args = (cls, url, schema, min_size, max_size, usage_retry, pooled)
        self._sender: Sender | None = None

    async def open(self) -> Sender:
        """Open the pool and return the sender (closing it is then the caller's job)."""
        cls, url, schema, min_size, max_size, usage_retry, pooled = self._args
        check_schema_name(schema)
        # With pooled, no statement cache: asyncpg then runs every statement unnamed.
        pool = await create_pool(
            url, min_size=min_size, max_size=max_size, statement_cache_size=0 if pooled else 100
        )
        sender = cls(pool, schema=schema, usage_retry=usage_retry)
        sender._owns_pool = True
        sender._driver.keep_connections()
        return sender

    async def __aenter__(self) -> Sender:
        self._sender = await self.open()
        return self._sender

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._sender is not None:
            await self._sender.close()
