"""Boot by role: HTTP first (health answers during install), then the api or worker side."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import anyio
import asyncpg
import structlog
from anyio.abc import TaskGroup

from api_sender import Sender
from api_sender.query import Rendered

from .db import statements as db
from .db.connections import (
    RETRYABLE_ERRORS,
    TRANSIENT_ERRORS,
    backoff_delay,
    check_pool_fits,
    open_pool,
)
from .db.embedded import start_embedded
from .db.migrations import SchemaMismatch, latest_version
from .db.search_path import warn_if_unsafe
from .declarations import JobDeclaration
from .install import install
from .jobs.registry import installed_jobs
from .jobs.spec import InstalledJob
from .queue.sql import render
from .runtime import WorkerRuntime
from .settings import ConfigError, Settings
from .signals import StopRequest, watch_signals
from .state import ServiceState

if TYPE_CHECKING:
    from .http.probe_server import ProbeServer
    from .http.server import HttpServer

log = structlog.get_logger("worker.boot")

T = TypeVar("T")

#: How often an api process checks whether a worker has installed the schema.
INSTALL_CHECK_SECONDS = 1.0


async def database_url(settings: Settings) -> str:
    """DATABASE_URL, or the embedded server's URL when it is unset."""
    if settings.database_url is not None:
        return settings.database_url.get_secret_value()
    return await start_embedded(settings.embedded_data_dir)


def session_url(settings: Settings, url: str) -> str:
    """Where what needs a session goes (the install's advisory lock, LISTEN, the purge run
    lock): DATABASE_DIRECT_URL, else ``url`` itself (contract section 12)."""
    if settings.database_direct_url is not None:
        return settings.database_direct_url.get_secret_value()
    return url


def http_server(settings: Settings, state: ServiceState) -> HttpServer | ProbeServer:
    """The listener of this role. Imported here: a worker process serves only the probes, and
    need not load Starlette and uvicorn (about 3.8 MB of its memory)."""
    if not settings.serves_ingest:
        from .http.probe_server import ProbeServer

        return ProbeServer(
            state,
            settings.http_host,
            settings.http_port,
            header_timeout=settings.http_header_timeout_seconds,
        )
    from .http.app import create_app
    from .http.server import HttpServer

    return HttpServer(
        create_app(state),
        settings.http_host,
        settings.http_port,
        header_timeout=settings.http_header_timeout_seconds,
        body_timeout=settings.http_body_timeout_seconds,
    )


async def run(settings: Settings, tools: list[JobDeclaration]) -> int:
    """Run the daemon until a signal; return the exit code.

    Signals are watched from the first instant: a stop during boot (waiting for the embedded
    server, an unreachable database, another replica's install lock) ends the process at once
    with exit 0, whatever boot was waiting for; once booted, a stop drains gracefully.
    """
    state = ServiceState(settings)
    stop = StopRequest()
    server = http_server(settings, state)
    jobs = installed_jobs(settings, tools) if settings.is_worker else []
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch_signals, stop)
        await tg.start(server.run)
        log.info("boot.started", role=settings.service_role, schema=settings.jobs_schema)
        try:
            booted = await _unless_stopped(stop, tg, lambda: _boot(settings, state, jobs))
            if booted is not None:
                url, pool = booted
                state.pool = pool
                sender = Sender(pool, schema=settings.jobs_schema, usage_retry=settings.usage_retry)
                state.sender = sender
                if settings.is_worker:
                    await _serve_worker(settings, url, pool, sender, state, jobs, stop)
                else:
                    await _serve_api(settings, pool, state, stop)
        finally:
            server.stop()
            if state.pool is not None:
                with anyio.move_on_after(5, shield=True):
                    await state.pool.close()
        tg.cancel_scope.cancel()
    log.info("shutdown.done")
    return 0


async def _unless_stopped(
    stop: StopRequest, tg: TaskGroup, step: Callable[[], Awaitable[T]]
) -> T | None:
    """``step``'s result, or ``None`` when a stop comes first: ``step`` is then cancelled
    wherever it waits (a connect, a backoff sleep, a lock, a thread)."""
    with anyio.CancelScope() as scope:

        async def cancel_on_stop() -> None:
            await stop.requested.wait()
            scope.cancel()

        tg.start_soon(cancel_on_stop)
        return await step()
    return None


async def _boot(
    settings: Settings, state: ServiceState, jobs: list[InstalledJob]
) -> tuple[str, asyncpg.Pool]:
    """Reach the database (the embedded server if DATABASE_URL is unset), install when this role
    installs, and open the pool."""
    url = await database_url(settings)
    if settings.is_worker:
        state.set_reason("installing")

        async def install_once() -> None:
            await install(
                session_url(settings, url),
                settings.jobs_schema,
                jobs,
                cron_tz=settings.cron_tz,
                lock_timeout=settings.install_lock_timeout_seconds,
            )

        await _until_reachable(install_once, "install.retry", state)
    return url, await _connect_pool(settings, url, state)


async def _until_stopped(stop: StopRequest, step: float) -> bool:
    """Sleep ``step`` seconds; ``True`` if a stop was requested meanwhile."""
    with anyio.move_on_after(step):
        await stop.requested.wait()
    return stop.requested.is_set()


async def _until_reachable(
    attempt_once: Callable[[], Awaitable[T]], event: str, state: ServiceState
) -> T:
    """Run ``attempt_once`` until it gets through, backing off while the database is
    unreachable or gives up on a statement a retry may pass (cancelled by statement_timeout, a
    deadlock): not ready, no crash loop. A URL asyncpg refuses is configuration: exit 2."""
    attempt = 0
    while True:
        try:
            return await attempt_once()
        except asyncpg.ClientConfigurationError as exc:
            raise ConfigError(f"invalid configuration: DATABASE_URL: {exc}") from None
        except RETRYABLE_ERRORS as exc:
            error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, TRANSIENT_ERRORS):
                state.set_reason("database unreachable")
            else:
                state.set_reason(f"database refused a start-up statement: {error}")
            delay = backoff_delay(attempt)
            attempt += 1
            log.warning(event, error=error, retry_in=round(delay, 2))
            await anyio.sleep(delay)


async def _connect_pool(settings: Settings, url: str, state: ServiceState) -> asyncpg.Pool:
    async def open_once() -> asyncpg.Pool:
        return await open_pool(
            url,
            size=settings.database_pool_size,
            statement_cache_size=settings.database_statement_cache_size,
        )

    pool = await _until_reachable(open_once, "db.unreachable", state)
    fits = False
    try:
        # Behind a transaction pooler (statement cache 0, contract section 12) the pool's
        # connections are the pooler's, not the server's: its limits do not apply.
        if settings.database_statement_cache_size:
            await _until_reachable(
                lambda: check_pool_fits(pool, settings.database_pool_size, settings.is_worker),
                "db.check_retry",
                state,
            )
        fits = True
    finally:
        if not fits:
            with anyio.move_on_after(5, shield=True):
                await pool.close()
    await warn_if_unsafe(pool)
    return pool


async def _serve_worker(
    settings: Settings,
    url: str,
    pool: asyncpg.Pool,
    sender: Sender,
    state: ServiceState,
    jobs: list[InstalledJob],
    stop: StopRequest,
) -> None:
    runtime = WorkerRuntime(settings, session_url(settings, url), pool, sender, jobs)
    # Readiness follows the runtime from here: until its listener first connects, which may
    # take long (the database refusing its set-up; the process waits, retrying), /readyz gives
    # the runtime's reason, with the error (runtime.check).
    state.checks.append(runtime.check)
    state.set_reason(None)
    async with anyio.create_task_group() as tg:

        async def start() -> bool:
            await tg.start(runtime.run)
            return True

        # A stop before the listener first connects ends the wait (and the runtime, which has
        # claimed nothing yet) at once.
        if await _unless_stopped(stop, tg, start):
            log.info("worker.ready", worker_id=str(runtime.owner))
            await stop.requested.wait()
            state.set_reason("stopping")
            await runtime.shutdown(settings.shutdown_grace_seconds)
        else:
            state.set_reason("stopping")
        tg.cancel_scope.cancel()


async def _serve_api(
    settings: Settings, pool: asyncpg.Pool, state: ServiceState, stop: StopRequest
) -> None:
    sql = render(settings.jobs_schema)
    expected = latest_version()
    while not stop.requested.is_set():
        reason = await _install_state(pool, sql.install_state, expected)
        if reason != state.not_ready_reason:
            if reason is None:
                log.info("api.ready")
            else:
                log.info("api.not_ready", reason=reason)
        state.set_reason(reason)
        # Once installed, keep checking slowly: a newer worker may migrate past this code.
        step = INSTALL_CHECK_SECONDS if reason else 30.0
        if await _until_stopped(stop, step):
            break
    state.set_reason("stopping")


async def _install_state(pool: asyncpg.Pool, query: Rendered, expected: int) -> str | None:
    try:
        row = await db.fetchrow(pool, query)
    except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError):
        return "schema not installed"
    except asyncpg.InsufficientPrivilegeError:
        return "permission denied on the queue schema (see config/roles.sql)"
    except TRANSIENT_ERRORS:
        return "database unreachable"
    assert row is not None
    if row["version"] is None or row["installed_at"] is None or row["version"] < expected:
        return "schema not installed"
    if row["version"] > expected:
        return str(
            SchemaMismatch(f"schema version {row['version']} is newer than this code ({expected})")
        )
    return None
