"""Opening the pool and the dedicated connections (LISTEN, install lock) with backoff."""

from __future__ import annotations

import random
from typing import Any

import anyio
import asyncpg
import structlog

from api_sender import create_pool

from ..settings import ConfigError

log = structlog.get_logger("worker.db")

#: Errors that mean "the database is not reachable right now", worth a retry with backoff.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.AdminShutdownError,
    asyncpg.ReadOnlySQLTransactionError,
    # A backend terminated while its connection sat idle in the pool can leave asyncpg's
    # protocol mid-error ("cannot switch to state N; another operation (2) is in progress",
    # MagicStack/asyncpg#1069) until the socket's close is seen; the next try gets a new one.
    asyncpg.InternalClientError,
    # "database is not currently accepting connections" (ALTER DATABASE ... ALLOW_CONNECTIONS
    # false during maintenance): it will accept them again; wait rather than exit.
    asyncpg.ObjectNotInPrerequisiteStateError,
    TimeoutError,
)

#: What the worker's own loops (listener and probe, pollers, completer, heartbeat, maintenance,
#: cron) retry with backoff instead of exiting: an unreachable database, and a statement the
#: server gave up on that a retry may pass: cancelled by statement_timeout (or an operator), a
#: deadlock or serialization failure (class 40). Not for HTTP answers: there only
#: TRANSIENT_ERRORS mean "database unreachable".
RETRYABLE_ERRORS: tuple[type[BaseException], ...] = (
    *TRANSIENT_ERRORS,
    asyncpg.QueryCanceledError,
    asyncpg.TransactionRollbackError,
)


def backoff_delay(attempt: int, *, base: float = 0.2, cap: float = 5.0) -> float:
    """Full-jitter exponential backoff: a random delay up to ``base * 2**attempt``, capped."""
    return random.uniform(base / 2, min(cap, base * 2 ** min(attempt, 10)))


async def connect(url: str, *, timeout: float = 10.0, **kwargs: Any) -> asyncpg.Connection:
    """One dedicated connection (never from the pool), for session locks and LISTEN."""
    return await asyncpg.connect(url, timeout=timeout, **kwargs)


async def connect_with_retry(
    url: str, *, what: str, deadline: float | None = None, **kwargs: Any
) -> asyncpg.Connection:
    """Connect, retrying transient failures with jittered backoff until ``deadline`` (monotonic).

    A URL asyncpg refuses outright (a bad sslmode, say) is configuration, never retried. The
    loop is cancellable at every wait: a stop during boot ends it at once.
    """
    attempt = 0
    while True:
        try:
            return await connect(url, **kwargs)
        except asyncpg.ClientConfigurationError as exc:
            raise ConfigError(f"invalid configuration: DATABASE_URL: {exc}") from None
        except TRANSIENT_ERRORS as exc:
            if deadline is not None and anyio.current_time() >= deadline:
                raise
            delay = backoff_delay(attempt)
            log.warning(
                "db.connect_retry",
                target=what,
                attempt=attempt + 1,
                retry_in=round(delay, 2),
                error=f"{type(exc).__name__}: {exc}",
            )
            attempt += 1
            if deadline is not None:
                delay = max(0.0, min(delay, deadline - anyio.current_time()))
            await anyio.sleep(delay)


async def open_pool(url: str, *, size: int, statement_cache_size: int) -> asyncpg.Pool:
    """The shared pool: at least one connection open so a dead database fails fast at boot."""
    return await create_pool(
        url,
        min_size=1,
        max_size=size,
        statement_cache_size=statement_cache_size,
        timeout=10.0,
        max_inactive_connection_lifetime=300.0,
    )


#: The connections a role may hold at once on this server: max_connections (less the slots
#: reserved for superusers and pg_use_reserved_connections, for everyone else), the role's and
#: the database's CONNECTION LIMIT (-1: none; superusers are exempt from all of these). Catalog
#: lookups of the current role and database only; no lock.
CONNECTION_LIMITS = """
SELECT r.rolsuper AS superuser,
       current_setting('max_connections')::int AS max_connections,
       current_setting('superuser_reserved_connections')::int
         + coalesce(current_setting('reserved_connections', true), '0')::int AS reserved,
       r.rolconnlimit AS role_limit,
       d.datconnlimit AS database_limit
FROM pg_roles r, pg_database d
WHERE r.rolname = current_user AND d.datname = current_database()
"""


async def check_pool_fits(pool: asyncpg.Pool, size: int, listener: bool) -> None:
    """Raise :class:`ConfigError` naming DATABASE_POOL_SIZE when the server can never give this
    process its pool (plus, for a worker, its two sessions of its own: LISTEN and the watch of
    unflushed completions)."""
    row = await pool.fetchrow(CONNECTION_LIMITS)
    if row is None:
        return
    needed = size + (2 if listener else 0)
    if row["superuser"]:
        limits = {"the server's max_connections": row["max_connections"]}
    else:
        limits = {"the server's max_connections": row["max_connections"] - row["reserved"]}
        if row["role_limit"] >= 0:
            limits["the role's CONNECTION LIMIT"] = row["role_limit"]
        if row["database_limit"] >= 0:
            limits["the database's CONNECTION LIMIT"] = row["database_limit"]
    which, allowed = min(limits.items(), key=lambda item: item[1])
    if needed > allowed:
        extra = " plus the worker's two sessions (LISTEN, flush watch)" if listener else ""
        raise ConfigError(
            f"invalid configuration: DATABASE_POOL_SIZE: {size}{extra} needs {needed} "
            f"connections, but {which} allows {allowed}; lower DATABASE_POOL_SIZE"
        )
