"""Operator commands facing a broken database set-up: one line on stderr saying what to do."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from tests.support.postgres import with_database
from tests.support.processes import free_port, run_cli, split_stderr

#: Every operator command, with arguments that would work on an installed database.
COMMANDS = {
    "queues": ["queues"],
    "queues --json": ["queues", "--json"],
    "send": ["send", "usage-events", '{"meter": "m", "quantity": 1, "workspace_id": "w"}'],
    "held list": ["held", "list"],
    "held list --json": ["held", "list", "--json"],
    "held redrive": ["held", "redrive", "--all"],
    "held discard": ["held", "discard", "01HZZZZZZZZZZZZZZZZZZZZZZZ", "--yes"],
    "migrate": ["migrate", "--wait", "0"],
}


@dataclass(frozen=True)
class Fault:
    """A DATABASE_URL that is wrong in one way, and what the one stderr line must contain."""

    url: str
    code: int
    words: tuple[str, ...]


@pytest.fixture
async def no_rights_role(admin_url: str) -> AsyncIterator[str]:
    """A login role with no rights on anything (what a wrong user in DATABASE_URL looks like)."""
    role = f"chassis_t_none_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(admin_url)
    await admin.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
    try:
        yield role
    finally:
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role
        )
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()


def _faults(admin_url: str, db_url: str, empty_db_url: str, role: str) -> dict[str, Fault]:
    missing = f"chassis_t_missing_{uuid.uuid4().hex[:8]}"
    port = free_port()
    return {
        "no database": Fault(
            with_database(admin_url, missing), 1, (f'"{missing}" does not exist', "DATABASE_URL")
        ),
        "refused": Fault(
            f"postgresql://postgres@127.0.0.1:{port}/chassis",
            1,
            (f"127.0.0.1:{port}", "PostgreSQL running"),
        ),
        "malformed": Fault("notaurl", 2, ("DATABASE_URL",)),
        "not installed": Fault(empty_db_url, 1, ('schema "jobs"', "chassis-worker migrate")),
        "no rights": Fault(
            db_url.replace("://postgres@", f"://{role}@"),
            1,
            ("permission denied", f'"{role}"', "config/roles.sql"),
        ),
    }


def _run(url: str, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(url, *argv, cwd=cwd, timeout=60)


@pytest.mark.parametrize("command", list(COMMANDS))
async def test_each_fault_is_one_line_on_stderr(
    command: str,
    admin_url: str,
    db_url: str,
    empty_db_url: str,
    no_rights_role: str,
    tmp_path: Path,
) -> None:
    """A missing database, a refused connection, a malformed URL, a schema not installed and a
    role without rights: one line on stderr naming the fault and the fix, nothing on stdout."""
    faults = _faults(admin_url, db_url, empty_db_url, no_rights_role)
    if command == "migrate":
        # migrate installs a missing schema: that one is no fault for it.
        del faults["not installed"]
    argv = COMMANDS[command]
    results = await asyncio.gather(
        *(asyncio.to_thread(_run, f.url, argv, tmp_path) for f in faults.values())
    )
    problems = []
    for (name, fault), result in zip(faults.items(), results, strict=True):
        # stderr also carries the command's log lines (migrate logs install.started): the
        # report is the one line that is not a log record, and no record holds a traceback.
        records, lines = split_stderr(result.stderr)
        ok = (
            result.returncode == fault.code
            and len(lines) == 1
            and result.stdout == ""
            and all(word in lines[0] for word in fault.words)
            and not any("exception" in record for record in records)
        )
        if not ok:
            problems.append(
                f"{name}: exit {result.returncode}, stdout {result.stdout[:300]!r}, "
                f"stderr {result.stderr[:600]!r}"
            )
    assert not problems, "\n".join(problems)


async def test_migrate_waits_for_an_unreachable_database_then_gives_up(tmp_path: Path) -> None:
    """migrate --wait 2 on a closed port retries (logged on stderr) and exits 1 after about 2 s,
    its last line saying what is wrong."""
    port = free_port()
    url = f"postgresql://postgres@127.0.0.1:{port}/chassis"
    result = await asyncio.to_thread(_run, url, ["migrate", "--wait", "2"], tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == ""
    records, lines = split_stderr(result.stderr)
    assert any(record["event"] == "db.connect_retry" for record in records), result.stderr
    assert len(lines) == 1, result.stderr
    assert f"127.0.0.1:{port}" in lines[0]
