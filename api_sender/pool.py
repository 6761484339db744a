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


#: The array types the producer's and the worker's statements bind (every cast to an array type;
#: the schema's own job_state[] aside, which may not exist yet when a pool opens).
ARRAY_TYPES = ("bigint[]", "int[]", "bytea[]", "bool[]", "uuid[]", "jsonb[]", "text[]")
_LEARN_TYPES = "SELECT " + ", ".join(f"${n}::{t}" for n, t in enumerate(ARRAY_TYPES, 1))


async def learn_types(conn: asyncpg.Connection) -> None:
    """Have a new connection learn the codecs of :data:`ARRAY_TYPES`, in one transaction.

    asyncpg looks a type up the first time one of a connection's statements binds it, in three
    statements: JIT off for the session, the lookup, JIT back as it was. Behind a transaction
    pooler (PgBouncer) each of the three may run on another server session, so the lookup, whose
    estimated cost is above jit_above_cost, can run with JIT on: 1.1-1.5 s of compiling, seen
    under a pooled connection's first completion while its queue claimed nothing (pickup p99
    1.0-2.3 s in 5 of 35 runs of the poll-mode pickup behind PgBouncer). In a transaction the
    pooler keeps all three on one session. An unnamed statement: nothing is left prepared.
    """
    async with conn.transaction():
        await conn.fetchrow(_LEARN_TYPES, *([None] * len(ARRAY_TYPES)))


async def create_pool(
    url: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    statement_cache_size: int = 100,
    **kwargs: Any,
) -> asyncpg.Pool:
    """Open a pool whose connections skip the reset query on release and learn the array
    types as they open (:func:`learn_types`)."""
    pool = await asyncpg.create_pool(
        url,
        min_size=min_size,
        max_size=max_size,
        statement_cache_size=statement_cache_size,
        reset=_keep_session,
        init=learn_types,
        **kwargs,
    )
    assert pool is not None
    return pool
