"""The producer: enqueue jobs into the durable queue, alone or inside the caller's transaction."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, Self, TypeAlias

import asyncpg

from .errors import InvalidJob, raise_sender_error
from .jobs import JobsApi
from .options import SendOptions, StartAfter, check_text, encode_all, encode_data
from .pool import create_pool
from .queues import QueuesApi
from .schema import check_schema_name
from .sql import SenderStatements, render
from .timers import Timers
from .usage import UsageRetry, UsageSink

#: A pool or a single connection: anything asyncpg can run a statement on.
Executor: TypeAlias = "asyncpg.Pool | asyncpg.Connection"


class Sender:
    """Enqueues jobs. Runs no DDL: it needs only INSERT/SELECT/UPDATE on the queue tables.

    Build one over an existing pool with ``Sender(pool)`` or let it own a pool with
    ``async with Sender.connect(url) as sender``.
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
        self._sql: SenderStatements = render(schema)
        self._owns_pool = False
        #: Durable usage emission (``sender.usage.emit(event)``); never raises into the caller.
        self.usage = UsageSink(self, retry=usage_retry)
        #: One-off timers, keyed or not (``sender.timers.schedule(...)``).
        self.timers = Timers(self)
        #: Look at jobs and act on them (``sender.jobs.retry([...])``), each action audited.
        self.jobs = JobsApi(pool, self.schema)
        #: Pause, resume and purge queues (``sender.queues.pause("q")``), each action audited.
        self.queues = QueuesApi(pool, self.schema)

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        schema: str = "jobs",
        min_size: int = 1,
        max_size: int = 10,
        usage_retry: UsageRetry | None = None,
    ) -> _Connecting:
        """Open a pool of its own; use as ``async with Sender.connect(url) as sender``."""
        return _Connecting(cls, url, schema, min_size, max_size, usage_retry)

    @property
    def pool(self) -> asyncpg.Pool:
        """The pool this sender enqueues through."""
        return self._pool

    @property
    def statements(self) -> SenderStatements:
        """The rendered producer statements (for the timers and usage helpers)."""
        return self._sql

    async def close(self) -> None:
        """Close the pool if this sender opened it."""
        if self._owns_pool:
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
        start_after: StartAfter = None,
        singleton_key: str | None = None,
        priority: int = 0,
        retry_limit: int | None = None,
        retry_delay: int | None = None,
        retry_backoff: bool | None = None,
        expire_in_seconds: int | None = None,
        connection: asyncpg.Connection | None = None,
    ) -> int | None:
        """Enqueue one job and return its id.

        ``data`` is anything JSON can carry; a pydantic model is sent as
        ``model.model_dump(mode="json")``. Returns ``None`` when the queue's policy refuses a
        second job for ``singleton_key`` (``short``/``stately`` queues). With ``connection=``,
        the job exists if and only if the caller's transaction commits. Raises
        :class:`QueueNotFound` for an unknown queue.
        """
        options = SendOptions(
            start_after=start_after,
            singleton_key=singleton_key,
            priority=priority,
            retry_limit=retry_limit,
            retry_delay=retry_delay,
            retry_backoff=retry_backoff,
            expire_in_seconds=expire_in_seconds,
        )
        return await self.send_with(queue, data, options, connection=connection)

    async def send_with(
        self,
        queue: str,
        data: Any,
        options: SendOptions,
        *,
        connection: asyncpg.Connection | None = None,
    ) -> int | None:
        """Like :meth:`send`, with the options given as one :class:`SendOptions` value."""
        check_text("queue", queue, optional=False)
        payload = encode_data(data)
        executor: Executor = connection if connection is not None else self._pool
        try:
            job_id: int | None = await executor.fetchval(
                self._sql.send, queue, payload, *options.args()
            )
        except asyncpg.PostgresError as exc:
            raise_sender_error(exc, queue=queue, schema=self.schema)
        return job_id

    async def send_many(
        self,
        queue: str,
        items: Iterable[Any],
        *,
        start_after: StartAfter = None,
        singleton_key: str | None = None,
        singleton_keys: Sequence[str | None] | None = None,
        priority: int = 0,
        retry_limit: int | None = None,
        retry_delay: int | None = None,
        retry_backoff: bool | None = None,
        expire_in_seconds: int | None = None,
        connection: asyncpg.Connection | None = None,
    ) -> list[int]:
        """Enqueue one job per item in a single statement and return their ids in order.

        Every job shares the options given; ``singleton_keys`` (one entry per item, ``None``
        for "the shared ``singleton_key``") gives each job its own key. The statement is atomic:
        every job is stored or none. On ``short``/``stately`` queues a refused key is left out
        of the returned ids. An item may be a pydantic model, sent as its
        ``model_dump(mode="json")``.
        """
        options = SendOptions(
            start_after=start_after,
            singleton_key=singleton_key,
            priority=priority,
            retry_limit=retry_limit,
            retry_delay=retry_delay,
            retry_backoff=retry_backoff,
            expire_in_seconds=expire_in_seconds,
        )
        return await self.send_many_with(
            queue, items, options, singleton_keys=singleton_keys, connection=connection
        )

    async def send_many_with(
        self,
        queue: str,
        items: Iterable[Any],
        options: SendOptions,
        *,
        singleton_keys: Sequence[str | None] | None = None,
        connection: asyncpg.Connection | None = None,
    ) -> list[int]:
        """Like :meth:`send_many`, with the shared options given as one :class:`SendOptions`."""
        check_text("queue", queue, optional=False)
        payloads = encode_all(items)
        keys = _check_keys(singleton_keys, len(payloads))
        if not payloads:
            return []
        executor: Executor = connection if connection is not None else self._pool
        try:
            ids = await executor.fetchval(
                self._sql.send_many, queue, payloads, *options.args(), keys
            )
        except asyncpg.PostgresError as exc:
            raise_sender_error(exc, queue=queue, schema=self.schema)
        return list(ids)


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
    ) -> None:
        self._args = (cls, url, schema, min_size, max_size, usage_retry)
        self._sender: Sender | None = None

    async def open(self) -> Sender:
        """Open the pool and return the sender (closing it is then the caller's job)."""
        cls, url, schema, min_size, max_size, usage_retry = self._args
        check_schema_name(schema)
        pool = await create_pool(url, min_size=min_size, max_size=max_size)
        sender = cls(pool, schema=schema, usage_retry=usage_retry)
        sender._owns_pool = True
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


def _check_keys(keys: Sequence[str | None] | None, count: int) -> list[str | None] | None:
    """The per-item singleton keys as a statement parameter, validated against the item count."""
    if keys is None:
        return None
    if isinstance(keys, str):
        raise InvalidJob(
            "singleton_keys must be a sequence of keys, not a string", "singleton_keys"
        )
    checked = list(keys)
    if len(checked) != count:
        raise InvalidJob(
            f"singleton_keys has {len(checked)} entries for {count} items", "singleton_keys"
        )
    for n, key in enumerate(checked):
        check_text(f"singleton_keys.{n}", key)
    return checked
