"""Settings the code or the database cannot carry are refused at boot: exit 2, naming them."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from tests.support.processes import free_port, run_cli, start_daemon
from worker.settings import load_settings

#: (variable, value): each accepted before and broke later (or never ended, or never fired).
BAD_VALUES = [
    # chassis_schedules_<schema> is a NOTIFY channel: 63 bytes at most.
    ("JOBS_SCHEMA", "s" * 46),
    ("JOBS_SCHEMA", "s" * 63),
    # PostgreSQL reserves pg_* schema names.
    ("JOBS_SCHEMA", "pg_jobs"),
    # Integer columns are int4; start_after is a timestamp; intervals have a range.
    ("USAGE_HELD_DELAY_SECONDS", str(10**13)),
    ("USAGE_RETRY_DELAY_SECONDS", "3000000000"),
    ("USAGE_RETRY_DELAY_SECONDS", "1000000"),
    ("USAGE_RETRY_LIMIT", "3000000000"),
    ("AUDIT_RETENTION_DAYS", str(10**9)),
    ("ORPHAN_USER_RETENTION_HOURS", str(10**12)),
    ("DATABASE_STATEMENT_CACHE_SIZE", str(10**12)),
    # Timeouts and sleeps: finite, positive, and within what the event loop can schedule.
    ("POLL_INTERVAL_SECONDS", "1e308"),
    ("POLL_INTERVAL_SECONDS", "inf"),
    ("POLL_INTERVAL_SECONDS", "nan"),
    ("HEARTBEAT_SECONDS", "nan"),
    ("WORKER_STALE_SECONDS", "inf"),
    ("MAINTENANCE_INTERVAL_SECONDS", "1e308"),
    ("SHUTDOWN_GRACE_SECONDS", "inf"),
    ("SHUTDOWN_GRACE_SECONDS", "1e12"),
    ("INSTALL_LOCK_TIMEOUT_SECONDS", "1e308"),
    ("HTTP_HEADER_TIMEOUT_SECONDS", "inf"),
    ("HTTP_BODY_TIMEOUT_SECONDS", "nan"),
    # A hub request longer than the usage job's lease would be rescued while still posting.
    ("HUB_TIMEOUT_SECONDS", "inf"),
    ("HUB_TIMEOUT_SECONDS", "3600"),
    # The contract's exit 2 for a DATABASE_URL that is no PostgreSQL URL at all.
    ("DATABASE_URL", "notaurl"),
    ("DATABASE_URL", "http://db.example.com/app"),
    ("DATABASE_URL", ""),
    ("DATABASE_URL", "postgresql://u@db.example.com:99999/app"),
    ("DATABASE_URL", "postgresql://u@db.example.com:port/app"),
    ("DATABASE_URL", "postgresql://u@db.example.com/app?sslmode=sometimes"),
    ("DATABASE_URL", "postgresql://u@h1,h2/app?target_session_attrs=writable"),
]


@pytest.mark.parametrize(("name", "value"), BAD_VALUES)
def test_out_of_range_setting_exits_2_naming_it(db_url: str, tmp_path, name, value) -> None:
    """A value the code or database cannot carry: exit 2, one stderr line naming the variable."""
    env = {"HTTP_PORT": "0", name: value}
    result = run_cli(db_url, "run", env=env, cwd=tmp_path, timeout=30)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert name in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@h1:5432,h2:5432/db?target_session_attrs=read-write",
        "postgres://u:p%40ss@[::1]:5432,10.0.0.2/db?sslmode=require",
        "postgresql:///db?host=/var/run/postgresql",
        "postgresql://",
    ],
)
def test_database_urls_asyncpg_takes_are_accepted(url: str) -> None:
    """Multi-host, IPv6, socket-directory and default-only URLs all pass validation."""
    settings = load_settings(_env_file=None, database_url=url)
    assert settings.database_url is not None


def test_every_command_validates_the_settings(db_url: str, tmp_path) -> None:
    """queues refuses a bad setting the same way run does (exit 2, one line, the variable)."""
    result = run_cli(db_url, "queues", env={"USAGE_RETRY_LIMIT": "-1"}, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "USAGE_RETRY_LIMIT" in result.stderr


def test_multi_host_url_reaches_the_writable_host(db_url: str, tmp_path) -> None:
    """A multi-host URL whose first host is down still serves a command through the second."""
    closed = free_port()
    rest = db_url.split("://", 1)[1]
    user, _, hostpath = rest.partition("@")
    host, _, path = hostpath.partition("/")
    url = f"postgresql://{user}@127.0.0.1:{closed},{host}/{path}?target_session_attrs=read-write"
    assert run_cli(url, "migrate", cwd=tmp_path).returncode == 0
    result = run_cli(url, "queues", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert '"usage-events"' in result.stdout


async def test_pool_larger_than_the_role_may_open_exits_2(
    db_url: str, admin_url: str, tmp_path
) -> None:
    """DATABASE_POOL_SIZE above the connections the server gives this role: exit 2 naming it."""
    role = f"chassis_t_lim_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(admin_url)
    await admin.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER CONNECTION LIMIT 3")
    try:
        url = db_url.replace("://postgres@", f"://{role}@")
        daemon = start_daemon(url, tmp_path, role="api", env={"DATABASE_POOL_SIZE": "4"})
        try:
            code = await asyncio.to_thread(daemon.wait, 20)
        finally:
            daemon.kill()
        assert code == 2, daemon.logs()
        assert "DATABASE_POOL_SIZE" in daemon.logs().strip().splitlines()[-1]
        assert "Traceback" not in daemon.logs()
    finally:
        dbname = db_url.rsplit("/", 1)[1]
        await admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()
