"""The install section: migrations, then every queue and schedule, under one session lock.

Runs on a dedicated connection (a session lock parked on a pooled connection would outlive its
user), with a lock key distinct from the migration lock. Handlers start only after it returns;
steady-state work never touches the lock.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import asyncpg
import structlog

from api_sender._schema import schedules_channel as schedules_channel  # re-exported

from .db.connections import connect_with_retry
from .db.locks import INSTALL, session_lock
from .db.migrations import migrate
from .jobs.spec import InstalledJob
from .queue.sql import QueueStatements, render

log = structlog.get_logger("worker.install")


def package_version() -> str:
    """This distribution's version (recorded with the install)."""
    try:
        return version("chassis-worker")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0+unknown"


async def install(
    url: str,
    schema: str,
    jobs: list[InstalledJob],
    *,
    cron_tz: str,
    lock_timeout: float,
    connect_deadline: float | None = None,
) -> None:
    """Migrate and install every queue and schedule; safe from any number of processes.

    An unreachable database is retried until ``connect_deadline`` (monotonic; ``None``: for
    as long as it takes, the daemon's way).
    """
    conn = await connect_with_retry(
        url,
        what="install",
        deadline=connect_deadline,
        server_settings={"application_name": "chassis-worker install"},
    )
    try:
        async with session_lock(conn, INSTALL, schema, timeout=lock_timeout):
            log.info("install.started", schema=schema, queues=len(jobs))
            await migrate(conn, schema, lock_timeout=lock_timeout)
            await install_queues(conn, render(schema), schema, jobs, cron_tz=cron_tz)
            log.info("install.done", schema=schema)
    finally:
        await conn.close()


async def install_queues(
    conn: asyncpg.Connection,
    sql: QueueStatements,
    schema: str,
    jobs: list[InstalledJob],
    *,
    cron_tz: str,
) -> None:
    """Create or update each queue, set or remove its schedule, mark the install done."""
    async with conn.transaction():
        changed = False
        for job in jobs:
            o = job.options
            await conn.execute(
                sql.upsert_queue,
                job.queue,
                o.policy,
                o.retry_limit,
                o.retry_delay,
                o.retry_backoff,
                o.expire_seconds,
                o.retention_seconds,
                o.failed_retention_seconds,
                o.dead_letter,
            )
            if job.cron is not None:
                touched = await conn.fetch(sql.upsert_schedule, job.queue, job.cron, cron_tz, None)
            else:
                touched = await conn.fetch(sql.delete_schedule, job.queue)
            changed = changed or bool(touched)
        await conn.execute(sql.install_done, package_version())
        if changed:
            await conn.execute("SELECT pg_notify($1, 'changed')", schedules_channel(schema))
