"""The operator commands' producer: a Sender on a one-connection pool of its own that honours
DATABASE_STATEMENT_CACHE_SIZE, so the commands work through a transaction pooler too (contract
section 12: no named prepared statement through PgBouncer)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from api_sender import Sender, create_pool

from ..settings import Settings


async def open_sender(settings: Settings, url: str) -> Sender:
    """Open the pool and the Sender over it; the caller closes ``sender.pool``."""
    pool = await create_pool(
        url, min_size=1, max_size=1, statement_cache_size=settings.database_statement_cache_size
    )
    return Sender(pool, schema=settings.jobs_schema, usage_retry=settings.usage_retry)


@asynccontextmanager
async def sender_for(settings: Settings, url: str) -> AsyncIterator[Sender]:
    """:func:`open_sender` for the block; the pool is closed after it."""
    sender = await open_sender(settings, url)
    try:
        yield sender
    finally:
        await sender.pool.close()
