"""The install section: migrations, then every queue and schedule, under one session lock.

Runs on a dedicated connection (a session lock parked on a pooled connection would outlive its
user), with a lock key distinct from the migration lock. Handlers start only after it returns;
steady-state work never touches the lock.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import asyncpg
import structlog

from api_sender.query import Query
from api_sender.schema import quoted
from api_sender.schema import schedules_channel as schedules_channel  # re-exported

from .db import statements as db
from .db.connections import connect_with_retry
from .db.locks import INSTALL, session_lock
from .db.migrations import migrate
from .declarations import dead_letter_refusal
from .jobs.spec import InstalledJob
from .queue.sql import QueueStatements, render
from .settings import ConfigError

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
            await grant_api_role(conn, schema)
            await install_queues(conn, render(schema), schema, jobs, cron_tz=cron_tz)
            log.info("install.done", schema=schema)
    finally:
        await conn.close()


#: config/roles.sql's grant function, when it was run on this database (none otherwise).
_HAS_GRANTS = Query("has_api_grants", "SELECT to_regprocedure(:routine) IS NOT NULL")
_GRANTS = Query("api_grants", "SELECT {s}.grant_api_role()")


async def grant_api_role(conn: asyncpg.Connection, schema: str) -> None:
    """Give the api role of config/roles.sql its decided rights on what the migrations just
    created (roles.sql keeps no default privileges, so a new table has none until then); a
    no-op without roles.sql, and one that writes nothing when the rights are already right.

    A failure is logged, not raised: the worker's own work needs none of it (the api role's
    readiness then names the missing right), and roles.sql run again sets the same grants."""
    routine = f"{quoted(schema)}.grant_api_role()"
    if not await db.fetchval(conn, _HAS_GRANTS.render(schema), routine=routine):
        return
    try:
        async with conn.transaction():
            await db.execute(conn, _GRANTS.render(schema))
    except asyncpg.PostgresError as exc:
        log.error(
            "install.api_grants_failed",
            error=f"{type(exc).__name__}: {exc}",
            hint="run config/roles.sql again",
        )


async def install_queues(
    conn: asyncpg.Connection,
    sql: QueueStatements,
    schema: str,
    jobs: list[InstalledJob],
    *,
    cron_tz: str,
) -> None:
    """Create or update each queue, set or remove its schedule, mark the install done.

    All or nothing: a dead letter that is not installed, or whose policy would drop copies
    (checked against the whole database, so against other deployments' queues too), raises
    :class:`ConfigError` and installs nothing.
    """
    async with conn.transaction():
        changed = False
        for job in jobs:
            o = job.options
            try:
                before = await db.fetchrow(
                    conn,
                    sql.upsert_queue,
                    name=job.queue,
                    policy=o.policy,
                    retry_limit=o.retry_limit,
                    retry_delay=o.retry_delay,
                    retry_backoff=o.retry_backoff,
                    expire_seconds=o.expire_seconds,
                    retention_seconds=o.retention_seconds,
                    failed_retention_seconds=o.failed_retention_seconds,
                    dead_letter=o.dead_letter,
                )
            except asyncpg.ForeignKeyViolationError:
                raise ConfigError(
                    f"invalid configuration: queue {job.queue!r} has dead letter "
                    f"{o.dead_letter!r}, which is not installed: declare it before {job.queue!r}"
                ) from None
            if before is not None and before["old_policy"] not in (None, o.policy):
                await _apply_policy(conn, sql, job.queue, before["old_policy"], o.policy)
            if job.cron is not None:
                touched = await db.fetch(
                    conn,
                    sql.upsert_schedule,
                    queue=job.queue,
                    cron=job.cron,
                    tz=cron_tz,
                    data=None,
                )
            else:
                touched = await db.fetch(conn, sql.delete_schedule, queue=job.queue)
            changed = changed or bool(touched)
        conflicts = await db.fetch(
            conn, sql.dead_letter_conflicts, queues=[job.queue for job in jobs]
        )
        if conflicts:
            first = conflicts[0]
            more = f" ({len(conflicts) - 1} more such queues)" if len(conflicts) > 1 else ""
            raise ConfigError(
                dead_letter_refusal(first["name"], first["dead_letter"], first["policy"], "") + more
            )
        await db.execute(conn, sql.install_done, version=package_version())
        if changed:
            await db.execute(conn, sql.notify_schedules, channel=schedules_channel(schema))


async def _apply_policy(
    conn: asyncpg.Connection, sql: QueueStatements, queue: str, old: str, new: str
) -> None:
    """Move the waiting jobs of ``queue`` to its new policy, where no policy index can refuse.

    ``kept`` in the log line counts the jobs left as they were: several wait for one key,
    which the new policy (short, stately) would not allow; they run as they are.
    """
    row = await db.fetchrow(conn, sql.apply_policy, queue=queue, policy=new)
    assert row is not None
    log.info(
        "install.policy_changed",
        queue=queue,
        old=old,
        new=new,
        moved=row["moved"],
        kept=row["kept"],
    )
