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


@contextlib.asynccontextmanager
async def extra_role(admin_url: str, tag: str) -> AsyncIterator[str]:
    """A plain login role of a fresh name (``tag`` marks the test file) beside the roles.sql
    pair, e.g. another tenant of the server; dropped on the way out, so a test's databases
    must be gone by then."""
    name = f"chassis_other_{tag}{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(
            f'CREATE ROLE "{name}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '
            f"'{PASSWORD}'"
        )
    finally:
        await admin.close()
    try:
        yield name
    finally:
        admin = await asyncpg.connect(admin_url)
        try:
            await admin.execute(f'DROP ROLE IF EXISTS "{name}"')
        finally:
            await admin.close()


#: What has_table_privilege, has_sequence_privilege and has_column_privilege are asked.
TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
SEQUENCE_PRIVILEGES = ("USAGE", "SELECT", "UPDATE")
COLUMN_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "REFERENCES")

_RELATION_RIGHTS = """
SELECT n.nspname AS schema, c.relname AS relation, c.relkind::text AS kind,
       ARRAY(SELECT p FROM unnest(CASE WHEN c.relkind = 'S' THEN $3::text[] ELSE $2::text[] END) p
             WHERE CASE WHEN c.relkind = 'S' THEN has_sequence_privilege($1, c.oid, p)
                        ELSE has_table_privilege($1, c.oid, p) END) AS granted
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = ANY($4::text[]) AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
"""
_COLUMN_RIGHTS = """
SELECT n.nspname AS schema, c.relname AS relation, a.attname AS column_name,
       ARRAY(SELECT p FROM unnest($2::text[]) p
             WHERE has_column_privilege($1, c.oid, a.attnum, p)) AS granted
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE n.nspname = ANY($3::text[]) AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
"""


@dataclass(frozen=True)
class Rights:
    """A role's privileges on one relation: on the whole of it (a table's or a sequence's), and
    on each of its columns (what has_column_privilege answers: the table's own count too)."""

    kind: str
    table: frozenset[str]
    columns: dict[str, frozenset[str]]


async def rights_of(
    conn: asyncpg.Connection, role: str, schemas: tuple[str, ...]
) -> dict[tuple[str, str], Rights]:
    """Every relation (tables, views, sequences...) of ``schemas`` with ``role``'s actual
    privileges on it and on each column, as the catalog answers."""
    out: dict[tuple[str, str], Rights] = {}
    for row in await conn.fetch(
        _RELATION_RIGHTS, role, list(TABLE_PRIVILEGES), list(SEQUENCE_PRIVILEGES), list(schemas)
    ):
        out[(row["schema"], row["relation"])] = Rights(row["kind"], frozenset(row["granted"]), {})
    for row in await conn.fetch(_COLUMN_RIGHTS, role, list(COLUMN_PRIVILEGES), list(schemas)):
        out[(row["schema"], row["relation"])].columns[row["column_name"]] = frozenset(
            row["granted"]
        )
    return out
