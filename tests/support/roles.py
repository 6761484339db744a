"""The api and worker roles of config/roles.sql for a test: fresh names, psql, the test password.

Roles are cluster-wide, so each test gets names of its own and drops them afterwards.
"""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from tests.support.processes import ROOT

ROLES_SQL = ROOT / "config" / "roles.sql"
#: The password apply_roles gives both roles (as_role logs in with it).
PASSWORD = "pw-roles-test"


@dataclass(frozen=True)
class Roles:
    """A pair of role names unique to one test (roles are cluster-wide)."""

    api: str
    worker: str


@contextlib.asynccontextmanager
async def fresh_roles(admin_url: str, tag: str) -> AsyncIterator[Roles]:
    """Fresh role names (``tag`` marks the test file); the roles are dropped on the way out,
    so a test's databases must be gone by then."""
    suffix = uuid.uuid4().hex[:10]
    names = Roles(api=f"chassis_api_{tag}{suffix}", worker=f"chassis_worker_{tag}{suffix}")
    try:
        yield names
    finally:
        admin = await asyncpg.connect(admin_url)
        try:
            for role in (names.api, names.worker):
                await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        finally:
            await admin.close()


def as_role(url: str, role: str) -> str:
    """``url`` with ``role`` (and the test password) as the user."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    netloc = f"{role}:{PASSWORD}@{host}:{parts.port or 5432}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def apply_roles(
    connect_url: str, roles: Roles, *, passwords: bool = True, **variables: str
) -> subprocess.CompletedProcess[str]:
    """Run config/roles.sql with psql as an operator would; fail the test if psql fails."""
    argv = ["psql", connect_url, "-X", "-v", "ON_ERROR_STOP=1"]
    settings = {"api_role": roles.api, "worker_role": roles.worker, **variables}
    if passwords:
        settings.update(api_password=PASSWORD, worker_password=PASSWORD)
    for name, value in settings.items():
        argv += ["-v", f"{name}={value}"]
    done = subprocess.run(
        [*argv, "-f", str(ROLES_SQL)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


async def refused(conn: asyncpg.Connection, statement: str) -> bool:
    """Whether ``statement`` fails for lack of privilege (rolled back either way)."""
    try:
        async with conn.transaction():
            await conn.execute(statement)
    except asyncpg.InsufficientPrivilegeError:
        return True
    return False
