"""The boot check of the sessions' search_path: a schema on it where a role the daemon does not
trust may create objects is named in a warning (a look-alike there would run inside the
daemon's statements with its rights)."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from tests.support.processes import start_daemon
from worker.db.search_path import warn_if_unsafe


async def test_a_default_public_schema_raises_no_warning(
    pool: asyncpg.Pool, captured_logs: list[dict[str, object]]
) -> None:
    """PostgreSQL 15's public (CREATE for the database owner only) is safe: nothing is said."""
    assert await warn_if_unsafe(pool) == []
    assert [e for e in captured_logs if e["event"] == "db.search_path_unsafe"] == []


async def test_create_for_public_or_another_role_on_the_path_is_named(
    pool: asyncpg.Pool, captured_logs: list[dict[str, object]]
) -> None:
    """CREATE on public granted to PUBLIC (older servers' default), or to a role that is neither
    a superuser nor one of the session user's, is one warning naming the schema and the roles."""
    role = f"chassis_planter_{uuid.uuid4().hex[:8]}"
    await pool.execute(f'CREATE ROLE "{role}"')
    try:
        await pool.execute(f'GRANT CREATE ON SCHEMA public TO PUBLIC, "{role}"')
        assert await warn_if_unsafe(pool) == ["public"]
        [warning] = [e for e in captured_logs if e["event"] == "db.search_path_unsafe"]
        assert warning["schema"] == "public"
        assert warning["roles"] == sorted(["PUBLIC", role])
        assert "REVOKE CREATE ON SCHEMA public" in str(warning["hint"])
    finally:
        await pool.execute(f'REVOKE CREATE ON SCHEMA public FROM PUBLIC, "{role}"')
        await pool.execute(f'DROP ROLE "{role}"')


@pytest.mark.slow
async def test_a_daemon_booting_on_an_unsafe_path_says_so(db_url: str, tmp_path) -> None:
    """The check runs at boot, for the api role as for the worker: the warning is in the log of
    a process whose database lets PUBLIC create in public, and the process still gets ready."""
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
    finally:
        await conn.close()
    daemon = start_daemon(db_url, tmp_path, role="all")
    try:
        await asyncio.to_thread(daemon.wait_ready, 60)
        assert [e["schema"] for e in daemon.events() if e["event"] == "db.search_path_unsafe"] == [
            "public"
        ]
    finally:
        daemon.kill()
