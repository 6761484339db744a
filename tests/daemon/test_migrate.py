"""Migrations and the install: idempotent, refusing unknown history, safe to race."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import asyncpg
import pytest

from tests.support.processes import base_env
from worker.db.migrations import SchemaMismatch, _log_notice, latest_version, migrate


async def test_migrate_twice_is_a_no_op(empty_db_url: str) -> None:
    """A second migrate applies nothing."""
    conn = await asyncpg.connect(empty_db_url)
    try:
        first = await migrate(conn, "jobs", lock_timeout=10)
        assert first == list(range(1, latest_version() + 1))
        assert await migrate(conn, "jobs", lock_timeout=10) == []
    finally:
        await conn.close()


async def test_database_with_unknown_migration_is_refused(db_url: str) -> None:
    """A database migrated by newer code is refused with a message naming the migration."""
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(
            "INSERT INTO jobs.schema_migration (version, name) VALUES (9999, 'from_the_future')"
        )
        with pytest.raises(SchemaMismatch, match="9999_from_the_future"):
            await migrate(conn, "jobs", lock_timeout=10)
    finally:
        await conn.close()


async def test_schema_name_is_configurable(empty_db_url: str) -> None:
    """JOBS_SCHEMA places the queue tables in another schema."""
    conn = await asyncpg.connect(empty_db_url)
    try:
        await migrate(conn, "other_jobs", lock_timeout=10)
        assert await conn.fetchval("SELECT to_regclass('other_jobs.job') IS NOT NULL")
        assert await conn.fetchval("SELECT to_regclass('jobs.job') IS NULL")
    finally:
        await conn.close()


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
async def test_five_processes_racing_migrate_all_exit_zero(empty_db_url: str, tmp_path) -> None:
    """Five `chassis-worker migrate` at once on a fresh database: all exit 0, installed once."""
    env = base_env(empty_db_url)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "worker", "migrate"],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for _ in range(5)
    ]
    outputs = await asyncio.gather(*(asyncio.to_thread(p.communicate, timeout=120) for p in procs))
    codes = [p.returncode for p in procs]
    assert codes == [0] * 5, [o[0].decode()[-2000:] for o in outputs]
    conn = await asyncpg.connect(empty_db_url)
    try:
        versions = await conn.fetch("SELECT version FROM jobs.schema_migration ORDER BY version")
        assert [r["version"] for r in versions] == list(range(1, latest_version() + 1))
        assert await conn.fetchval("SELECT count(*) FROM jobs.queue") == 6
        assert await conn.fetchval("SELECT completed_at IS NOT NULL FROM jobs.install")
    finally:
        await conn.close()


async def test_migration_0003_drops_job_due_left_by_an_older_install(db_url: str) -> None:
    """A database installed before job_due left 0001 still has that index; the next migrate
    drops it, so sends stop paying for its entries."""
    conn = await asyncpg.connect(db_url)
    try:
        # What an install by a build before 2026-11-30 looks like: job_due present, 0003 not run.
        await conn.execute(
            "CREATE INDEX job_due ON jobs.job (queue, start_after) WHERE state < 'active'"
        )
        await conn.execute("DELETE FROM jobs.schema_migration WHERE version = 3")
        assert await migrate(conn, "jobs", lock_timeout=10) == [3]
        assert await conn.fetchval("SELECT to_regclass('jobs.job_due')") is None
    finally:
        await conn.close()


async def test_a_fresh_migrate_and_every_later_one_log_no_notice(
    empty_db_url: str, captured_logs: list[dict[str, object]]
) -> None:
    """Migrating an empty database, then again as every boot does, logs no
    ``migrate.notice``: the IF [NOT] EXISTS statements that had nothing to do ("index job_due
    does not exist, skipping", "schema jobs already exists, skipping") are not news."""
    conn = await asyncpg.connect(empty_db_url)
    try:
        await migrate(conn, "jobs", lock_timeout=10)
        await migrate(conn, "jobs", lock_timeout=10)
    finally:
        await conn.close()
    assert [e for e in captured_logs if e["event"] == "migrate.notice"] == []
    assert [e["event"] for e in captured_logs].count("migrate.applied") == latest_version()


async def test_notices_that_say_something_are_still_logged(
    db_url: str, captured_logs: list[dict[str, object]]
) -> None:
    """A migration's own RAISE NOTICE or WARNING (what it could not do) is still logged; only
    the no-op notices of IF [NOT] EXISTS are dropped."""
    conn = await asyncpg.connect(db_url)
    conn.add_log_listener(_log_notice)
    try:
        await conn.execute("CREATE SCHEMA IF NOT EXISTS jobs")
        await conn.execute("DROP INDEX IF EXISTS jobs.no_such_index")
        await conn.execute(
            "DO $$ BEGIN RAISE NOTICE 'kept notice'; RAISE WARNING 'kept warning'; END $$"
        )
        await conn.execute("SELECT 1")  # notices arrive before the statement's answer
    finally:
        await conn.close()
    notices = [
        (e["severity"], e["message"]) for e in captured_logs if e["event"] == "migrate.notice"
    ]
    assert notices == [("NOTICE", "kept notice"), ("WARNING", "kept warning")]
