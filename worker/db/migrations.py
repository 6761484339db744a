"""Plain-SQL migrations: applied in order, one transaction each, under a session advisory lock."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import asyncpg
import structlog

from api_sender.query import Query
from api_sender.schema import quoted

from . import statements as db
from .locks import MIGRATE, session_lock

log = structlog.get_logger("worker.migrate")

#: Whether the schema was ever migrated (its record table exists).
_MIGRATED = Query("migrated", "SELECT to_regclass('{s}.schema_migration') IS NOT NULL")
#: The migrations a schema has.
_RECORDED = Query("recorded_migrations", "SELECT version, name FROM {s}.schema_migration")
#: A migration applied, recorded in its own transaction.
_RECORD = Query(
    "record_migration", "INSERT INTO {s}.schema_migration (version, name) VALUES (:version, :name)"
)

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


class SchemaMismatch(Exception):
    """The database's migrations do not match this code (newer, or a different history)."""


@dataclass(frozen=True, slots=True)
class Migration:
    """One ``migrations/NNNN_name.sql`` file."""

    version: int
    name: str
    sql: str


def migrations_dir() -> Path:
    """Where the SQL files are: inside the installed package, else the source checkout."""
    packaged = Path(str(resources.files("worker"))) / "_migrations"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "migrations"


def load_migrations(directory: Path | None = None) -> list[Migration]:
    """Every migration file in version order; refuses gaps and duplicate versions."""
    directory = directory or migrations_dir()
    found: list[Migration] = []
    for path in sorted(directory.iterdir()):
        match = _FILE.match(path.name)
        if match:
            found.append(Migration(int(match[1]), match[2], path.read_text(encoding="utf-8")))
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise SchemaMismatch(f"migration files out of sequence at {migration.version:04d}")
    return found


def latest_version(migrations: list[Migration] | None = None) -> int:
    """The version a fully migrated database is at."""
    migrations = migrations if migrations is not None else load_migrations()
    return migrations[-1].version if migrations else 0


async def applied_versions(conn: asyncpg.Connection, schema: str) -> dict[int, str] | None:
    """Versions recorded in the database, or ``None`` when the schema was never migrated."""
    exists = await db.fetchval(conn, _MIGRATED.render(schema))
    if not exists:
        return None
    rows = await db.fetch(conn, _RECORDED.render(schema))
    return {row["version"]: row["name"] for row in rows}


def check_known(applied: dict[int, str], migrations: list[Migration]) -> None:
    """Refuse a database that has migrations this code does not know."""
    known = {m.version: m.name for m in migrations}
    unknown = sorted(v for v in applied if v not in known)
    if unknown:
        names = ", ".join(f"{v:04d}_{applied[v]}" for v in unknown)
        raise SchemaMismatch(
            f"the database has migration(s) {names} that this chassis-worker does not know; "
            "run a newer release"
        )
    for version, name in applied.items():
        if known[version] != name:
            raise SchemaMismatch(
                f"migration {version:04d} is {name!r} in the database but "
                f"{known[version]!r} here; the histories differ"
            )


def _nothing_to_do(message: asyncpg.PostgresLogMessage) -> bool:
    """Whether ``message`` is the notice of an IF [NOT] EXISTS that had nothing to do.

    PostgreSQL sends "... already exists, skipping" with the duplicate object's SQLSTATE (class
    42) and "... does not exist, skipping" with 00000, in the server's language, so they are
    told by their code and origin, not their text: a migration's own RAISE NOTICE (also 00000)
    comes from PL/pgSQL's pl_exec.c, and what a migration could not do is a WARNING."""
    code = getattr(message, "sqlstate", None) or ""
    return (
        getattr(message, "severity_en", None) == "NOTICE"
        and (code == "00000" or code.startswith("42"))
        and getattr(message, "server_source_filename", None) != "pl_exec.c"
    )


def _log_notice(_conn: object, message: asyncpg.PostgresLogMessage) -> None:
    if _nothing_to_do(message):
        return
    level = getattr(message, "severity", "NOTICE")
    text = getattr(message, "message", str(message))
    if level in ("WARNING", "ERROR"):
        log.warning("migrate.notice", severity=level, message=text)
    else:
        log.info("migrate.notice", severity=level, message=text)


async def migrate(conn: asyncpg.Connection, schema: str, *, lock_timeout: float) -> list[int]:
    """Apply pending migrations on a dedicated connection; return the versions applied.

    Any number of processes may call this at once: the session lock serialises them, and each
    re-reads what is applied after taking it.
    """
    migrations = load_migrations()
    q = quoted(schema)
    applied_now: list[int] = []
    # A migration reports what it could not do (an index on a table the app owns) as a server
    # notice; asyncpg drops notices unless someone listens.
    conn.add_log_listener(_log_notice)
    try:
        async with session_lock(conn, MIGRATE, schema, timeout=lock_timeout):
            async with conn.transaction():
                await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {q}")
                await conn.execute(
                    f"""CREATE TABLE IF NOT EXISTS {q}.schema_migration (
                            version integer PRIMARY KEY,
                            name text NOT NULL,
                            applied_at timestamptz NOT NULL DEFAULT now())"""
                )
            applied = await applied_versions(conn, schema) or {}
            check_known(applied, migrations)
            for migration in migrations:
                if migration.version in applied:
                    continue
                async with conn.transaction():
                    await conn.execute(f"SET LOCAL search_path TO {q}, public")
                    await conn.execute(migration.sql)
                    await db.execute(
                        conn,
                        _RECORD.render(schema),
                        version=migration.version,
                        name=migration.name,
                    )
                log.info(
                    "migrate.applied", schema=schema, version=migration.version, name=migration.name
                )
                applied_now.append(migration.version)
    finally:
        conn.remove_log_listener(_log_notice)
    return applied_now
