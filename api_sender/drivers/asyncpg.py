"""asyncpg: the Sender's own pool, and a caller's connection."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import cast

import asyncpg

from ..operation import Rows, Step
from .base import AsyncDriver, Bound


class AsyncpgDriver(Bound):
    """asyncpg: a pool (each operation on one acquired connection) or a connection."""

    def __init__(self, executor: asyncpg.Pool | asyncpg.Connection, schema: str) -> None:
        super().__init__(schema)
        self._executor = executor

    async def execute(self, step: Step) -> Rows:
        text, args = self.bind(step)
        return cast("Rows", await self._executor.fetch(text, *args))

    def scope(self, atomic: bool) -> AbstractAsyncContextManager[AsyncDriver] | None:
        return self._transaction() if atomic else None

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncDriver]:
        # A transaction, or a savepoint when the connection is already in one.
        if isinstance(self._executor, asyncpg.Pool):
            async with self._executor.acquire() as conn, conn.transaction():
                yield AsyncpgDriver(conn, self.schema)
        else:
            async with self._executor.transaction():
                yield self
