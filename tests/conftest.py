"""Fixtures: a real PostgreSQL database per test, cloned from a migrated template."""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
import structlog

from api_sender import Sender, create_pool
from tests.support.postgres import (
    create_database,
    drop_database,
    ensure_template,
    server_url,
    with_database,
)

os.environ.pop("DATABASE_URL", None)


@pytest.fixture(autouse=True)
def serialised_group(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Tests marked ``xdist_group(name)`` run one at a time across xdist workers.

    They start several daemon processes each; run side by side they would exceed the test
    server's connections. (``--dist loadgroup`` should do this, but pytest-xdist 3.8 on pytest
    9.2 no longer groups: pytest-dev/pytest-xdist#1386.) A file lock per group name does.
    """
    marker = request.node.get_closest_marker("xdist_group")
    if marker is None or not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    name = str(marker.args[0] if marker.args else marker.kwargs.get("name", "group"))
    lock = tmp_path_factory.getbasetemp().parent / f"group-{name}.lock"
    with lock.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def admin_url() -> str:
    """URL of the maintenance database of the test server."""
    return server_url()


@pytest.fixture(scope="session")
def template_name(admin_url: str) -> str:
    """The migrated template database (built once per run, shared by parallel workers)."""
    return asyncio.run(ensure_template(admin_url))


@pytest.fixture
async def db_url(admin_url: str, template_name: str) -> AsyncIterator[str]:
    """A fresh, migrated database for this test alone."""
    name = await create_database(admin_url, template_name)
    try:
        yield with_database(admin_url, name)
    finally:
        await drop_database(admin_url, name)


@pytest.fixture
async def empty_db_url(admin_url: str) -> AsyncIterator[str]:
    """A fresh database with nothing installed."""
    name = await create_database(admin_url, None)
    try:
        yield with_database(admin_url, name)
    finally:
        await drop_database(admin_url, name)


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool on this test's database."""
    p = await create_pool(db_url, min_size=1, max_size=8)
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture
async def sender(pool: asyncpg.Pool) -> Sender:
    """A sender over this test's pool."""
    return Sender(pool)


@pytest.fixture
def captured_logs() -> Iterator[list[dict[str, object]]]:
    """structlog events emitted during the test."""
    with structlog.testing.capture_logs() as logs:
        yield logs
