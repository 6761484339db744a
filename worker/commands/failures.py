"""What an operator command tells its user when the database set-up is wrong: one line.

A missing database, a refused connection, a login the server refuses, a role without rights and
a schema that is not installed are faults of the set-up, not of the code: each becomes one line
on stderr saying what is wrong and what to do (exit 1; 2 for a URL asyncpg cannot use at all),
never a traceback.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import asyncpg

from ..db.locks import LockTimeout
from ..db.migrations import SchemaMismatch
from ..db.urls import shown_hosts

EXIT_ERROR = 1
EXIT_CONFIG = 2


class Unreachable(Exception):
    """The database could not be reached at all (refused, no route, no such host, timed out)."""

    def __init__(self, url: str, reason: str) -> None:
        hosts = shown_hosts(url)
        where = f" at {hosts}" if hosts else ""
        super().__init__(
            f"error: cannot reach the database{where} ({reason}): is PostgreSQL running, and "
            "is DATABASE_URL right?"
        )


@asynccontextmanager
async def reaching(url: str) -> AsyncIterator[None]:
    """Report a failure to connect inside the block as :class:`Unreachable` (wrap only the
    connecting: an ``OSError`` elsewhere, a closed stdout say, is something else)."""
    try:
        yield
    except (OSError, TimeoutError, asyncpg.PostgresConnectionError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise Unreachable(url, reason) from exc


@dataclass(frozen=True, slots=True)
class Failure:
    """The exit code and the one line a known fault is reported with."""

    code: int
    line: str


def describe_failure(exc: BaseException, *, schema: str, url: str | None) -> Failure | None:
    """The report of ``exc`` when it is a known set-up fault, else ``None`` (a bug: traceback).

    ``url`` is the database URL in use (``None`` before one was known); only its hosts and user
    name are ever shown, never its password.
    """
    hosts = shown_hosts(url) if url else ""
    where = f" at {hosts}" if hosts else ""
    if isinstance(exc, asyncpg.ClientConfigurationError):
        return Failure(EXIT_CONFIG, f"invalid configuration: DATABASE_URL: {exc}")
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        return Failure(
            EXIT_ERROR, f"error: {exc}: create it, or fix the database name in DATABASE_URL"
        )
    if isinstance(
        exc, asyncpg.InvalidPasswordError | asyncpg.InvalidAuthorizationSpecificationError
    ):
        return Failure(
            EXIT_ERROR,
            f"error: the database{where} refused the login ({exc}): "
            "check the user and password in DATABASE_URL",
        )
    if isinstance(exc, asyncpg.InsufficientPrivilegeError):
        return Failure(
            EXIT_ERROR,
            f"error: {exc} (role {_role(url)}): grant the role the rights in config/roles.sql "
            "(migrate, queues and held need the worker role)",
        )
    if isinstance(exc, asyncpg.UndefinedTableError | asyncpg.InvalidSchemaNameError):
        return Failure(
            EXIT_ERROR,
            f'error: schema "{schema}" is not installed in this database: run chassis-worker '
            "migrate (or set JOBS_SCHEMA to the schema that is)",
        )
    if isinstance(exc, asyncpg.CannotConnectNowError | asyncpg.TooManyConnectionsError):
        return Failure(EXIT_ERROR, f"error: the database{where} refused a connection: {exc}")
    if isinstance(exc, Unreachable):
        return Failure(EXIT_ERROR, str(exc))
    if isinstance(exc, SchemaMismatch):
        return Failure(EXIT_ERROR, f"error: {exc}")
    if isinstance(exc, LockTimeout):
        return Failure(
            EXIT_ERROR,
            f"error: {exc}; another install still holds it (raise INSTALL_LOCK_TIMEOUT_SECONDS "
            "to wait longer)",
        )
    return None


def innermost(exc: BaseException) -> BaseException:
    """The one exception inside task-group wrappers (``ExceptionGroup`` of one), else ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _role(url: str | None) -> str:
    """The login role of ``url``, quoted, for messages."""
    try:
        user = urlsplit(url).username if url else None
    except ValueError:
        user = None
    return f'"{unquote(user)}"' if user else "of DATABASE_URL"
