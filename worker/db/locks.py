"""Session advisory locks on a dedicated connection, with a bounded, logged wait."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import asyncpg
import structlog

from api_sender.query import Query

from . import statements as db

log = structlog.get_logger("worker.db")

#: Lock namespaces; the key is derived from the purpose and the schema, so the migration lock,
#: the install lock and the maintenance lock never collide, nor do two schemas in one database.
MIGRATE = "migrate"
INSTALL = "install"
MAINTENANCE = "maintenance"
THROUGHPUT = "throughput"

_KEY_SQL = "hashtextextended('chassis-worker:' || :purpose::text || ':' || :schema::text, 0)"
_LOCK = Query("advisory_lock", f"SELECT pg_advisory_lock({_KEY_SQL})").render("public")
_UNLOCK = Query("advisory_unlock", f"SELECT pg_advisory_unlock({_KEY_SQL})").render("public")
_TRY_XACT_LOCK = Query(
    "try_advisory_xact_lock", f"SELECT pg_try_advisory_xact_lock({_KEY_SQL})"
).render("public")


class LockTimeout(Exception):
    """Another process held the lock past the allowed wait."""


@asynccontextmanager
async def session_lock(
    conn: asyncpg.Connection, purpose: str, schema: str, *, timeout: float, poll: float = 5.0
) -> AsyncIterator[None]:
    """Hold a session advisory lock for the block; wait at most ``timeout`` seconds for it.

    The wait is done in slices of ``poll`` seconds (``lock_timeout``) so the process logs that
    it is waiting and who it waits for, instead of hanging silently.
    """
    deadline = anyio.current_time() + timeout
    waited = False
    while True:
        slice_ms = max(1, int(min(poll, max(0.001, deadline - anyio.current_time())) * 1000))
        try:
            async with conn.transaction():
                await conn.execute(f"SET LOCAL lock_timeout = {slice_ms}")
                await db.execute(conn, _LOCK, purpose=purpose, schema=schema)
            break
        except asyncpg.LockNotAvailableError:
            if anyio.current_time() >= deadline:
                raise LockTimeout(
                    f"waited {timeout:.0f}s for the {purpose} lock of schema {schema!r}"
                ) from None
            holder = await conn.fetchval(
                """
                SELECT string_agg(a.pid || ' ' || coalesce(a.application_name, ''), ', ')
                FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                WHERE l.locktype = 'advisory' AND l.granted
                """
            )
            log.info("lock.waiting", purpose=purpose, schema=schema, holders=holder)
            waited = True
    if waited:
        log.info("lock.acquired", purpose=purpose, schema=schema)
    try:
        yield
    finally:
        if not conn.is_closed():
            with anyio.CancelScope(shield=True):
                await db.execute(conn, _UNLOCK, purpose=purpose, schema=schema)


async def try_xact_lock(conn: asyncpg.Connection, purpose: str, schema: str) -> bool:
    """Take a transaction-level advisory lock if free (call inside a transaction)."""
    got: bool = await db.fetchval(conn, _TRY_XACT_LOCK, purpose=purpose, schema=schema)
    return got
