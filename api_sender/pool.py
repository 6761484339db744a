"""The asyncpg pool chassis-worker opens for itself."""

from __future__ import annotations

from typing import Any

import asyncpg


async def _keep_session(connection: asyncpg.Connection) -> None:
    """Release hook that skips asyncpg's per-release reset round trip.

    asyncpg's default reset runs ``pg_advisory_unlock_all(); UNLISTEN *; RESET ALL`` every time a
    connection goes back to the pool, doubling the round trips of a single send. Our pooled
    connections never carry session state (locks and LISTEN live on dedicated connections), and
    an open transaction is still rolled back by asyncpg before this hook runs.
    """


async def create_pool(
    url: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    statement_cache_size: int = 100,
    **kwargs: Any,
) -> asyncpg.Pool:
    """Open a pool whose connections skip the reset query on release."""
    pool = await asyncpg.create_pool(
        url,
        min_size=min_size,
        max_size=max_size,
        statement_cache_size=statement_cache_size,
        reset=_keep_session,
        **kwargs,
    )
    assert pool is not None
    return pool
