"""Declarations the install refuses: exit 2, one line naming them, nothing installed."""

from __future__ import annotations

import asyncpg
import pytest

from tests.support.processes import run_cli, split_stderr
from tests.support.queues import make_queue

CHASSIS_QUEUES = [
    "usage-events",
    "usage-events-held",
    "audit-purge",
    "apikey-expiry-sweep",
    "idempotency-purge",
    "orphan-user-purge",
]


async def schema_absent(url: str) -> bool:
    """Whether nothing at all was installed in the database at ``url``."""
    conn = await asyncpg.connect(url)
    try:
        return bool(await conn.fetchval("SELECT to_regnamespace('jobs') IS NULL"))
    finally:
        await conn.close()


def refused(url: str, command: str, env: dict[str, str], cwd) -> str:
    """Run ``command`` and return its one stderr line (besides migrate's log records, which go
    to stderr too), asserting exit 2 and no traceback."""
    result = run_cli(url, command, env={"HTTP_PORT": "0", **env}, cwd=cwd, timeout=30)
    assert result.returncode == 2, result.stdout + result.stderr
    _, lines = split_stderr(result.stderr)
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def assert_names(line: str, *parts: str) -> None:
    """The refusal names every one of ``parts``."""
    missing = [part for part in parts if part not in line]
    assert not missing, f"{missing} not in {line!r}"


@pytest.mark.parametrize("command", ["run", "migrate"])
@pytest.mark.parametrize("queue", CHASSIS_QUEUES)
async def test_a_tool_redeclaring_a_chassis_queue_is_refused(
    empty_db_url: str, tmp_path, command: str, queue: str
) -> None:
    """TOOL_JOBS declaring a chassis queue: exit 2, one line naming the declaration, and the
    database untouched."""
    path = "tests.support.tooljobs:REDECLARE"
    line = refused(empty_db_url, command, {"TOOL_JOBS": path, "TEST_TOOL_QUEUE": queue}, tmp_path)
    assert_names(line, "TOOL_JOBS", path, repr(queue))
    assert await schema_absent(empty_db_url)


@pytest.mark.parametrize("command", ["run", "migrate"])
@pytest.mark.parametrize("policy", ["short", "stately"])
async def test_a_short_or_stately_dead_letter_is_refused(
    empty_db_url: str, tmp_path, command: str, policy: str
) -> None:
    """A dead letter whose policy keeps one keyless copy (short, stately) is refused at boot."""
    env = {
        "TOOL_JOBS": "tests.support.tooljobs:DEAD_LETTER_POLICY",
        "TEST_TOOL_DEAD_POLICY": policy,
    }
    line = refused(empty_db_url, command, env, tmp_path)
    assert_names(line, "'tool-src'", "'tool-dead'", policy)
    assert await schema_absent(empty_db_url)


async def test_a_queue_that_is_its_own_dead_letter_is_refused(empty_db_url: str, tmp_path) -> None:
    """A queue naming itself as dead letter (its failures would come back forever) is refused."""
    env = {"TOOL_JOBS": "tests.support.tooljobs:SELF_DEAD_LETTER"}
    line = refused(empty_db_url, "migrate", env, tmp_path)
    assert_names(line, "'tool-self'", "dead letter")
    assert await schema_absent(empty_db_url)


@pytest.mark.parametrize("policy", ["standard", "singleton"])
def test_a_standard_or_singleton_dead_letter_is_installed(
    db_url: str, tmp_path, policy: str
) -> None:
    """A dead letter of policy standard or singleton installs as declared."""
    env = {
        "TOOL_JOBS": "tests.support.tooljobs:DEAD_LETTER_POLICY",
        "TEST_TOOL_DEAD_POLICY": policy,
    }
    result = run_cli(db_url, "migrate", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("command", ["run", "migrate"])
async def test_a_short_dead_letter_installed_by_another_deployment_is_refused(
    db_url: str, pool: asyncpg.Pool, tmp_path, command: str
) -> None:
    """A dead letter this deployment does not declare, already in the database as short: the
    install is refused (exit 2, one line naming both queues) and installs nothing."""
    await make_queue(pool, "tool-elsewhere", policy="short")
    installed_at = await pool.fetchval("SELECT completed_at FROM jobs.install")
    env = {"TOOL_JOBS": "tests.support.tooljobs:DEAD_LETTER_ELSEWHERE"}
    line = refused(db_url, command, env, tmp_path)
    assert_names(line, "'tool-src'", "'tool-elsewhere'", "short")
    names = await pool.fetch("SELECT name FROM jobs.queue ORDER BY name")
    assert [n["name"] for n in names] == ["tool-elsewhere"]
    assert await pool.fetchval("SELECT completed_at FROM jobs.install") == installed_at
