"""The pool as handlers see it: at most ``limit`` connections at once.

The claim, completion and heartbeat statements always find a connection, because handlers
together can never hold more than the pool size minus a reserve.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import asyncpg


class HandlerPool:
    """A bounded view of an asyncpg pool for job handlers."""

    def __init__(self, pool: asyncpg.Pool, limit: int) -> None:
        self.raw = pool
        self.limit = max(1, limit)
        self._limiter = anyio.CapacityLimiter(self.limit)

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[asyncpg.Connection]:
        """Borrow a connection, waiting for a handler slot first."""
        async with self._limiter, self.raw.acquire() as conn:
            yield conn

    async def execute(self, query: str, *args: Any) -> str:
        """Run a statement on a borrowed connection; return its status."""
        async with self.acquire() as conn:
            status: str = await conn.execute(query, *args)
            return status

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        """Run a query on a borrowed connection; return its rows."""
        async with self.acquire() as conn:
            rows: list[asyncpg.Record] = await conn.fetch(query, *args)
            return rows

    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        """Run a query on a borrowed connection; return its first row."""
        async with self.acquire() as conn:
            row: asyncpg.Record | None = await conn.fetchrow(query, *args)
            return row

    async def fetchval(self, query: str, *args: Any) -> Any:
        """Run a query on a borrowed connection; return the first column of its first row."""
        async with self.acquire() as conn:
            return await conn.fetchval(query, *args)
