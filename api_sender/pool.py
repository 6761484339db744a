"""The asyncpg pool chassis-worker opens for itself."""

from __future__ import annotations

from typing import Any

import asyncpg


async def _keep_session(connection: asyncpg.Connection) -> None:
    """Release hook that skips asyncpg's per-release reset round trip, and drops a session
    that opened read-only.

    asyncpg's default reset runs ``pg_advisory_unlock_all(); UNLISTEN *; RESET ALL`` every time a
    connection goes back to the pool, doubling the round trips of a single send. Our pooled
    connections never carry session state (locks and LISTEN live on dedicated connections), and
    an open transaction is still rolled back by asyncpg before this hook runs.

    A session opened while the database defaulted to read-only (``default_transaction_read_only``
    on, or a hot standby after a failover) stays read-only for its whole life, even once writes
    are allowed again, so every write through it would fail forever. The server reports both
    settings to the client, so the check costs no round trip: such a session is closed here and
    the pool opens a fresh one at the next acquire.
    """
    settings = connection.get_settings()
    if "on" in (
        getattr(settings, "default_transaction_read_only", "off"),
        getattr(settings, "in_hot_standby", "off"),
    ):
        connection.terminate()


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
