"""Fixtures: a real PostgreSQL database per test, cloned from a migrated template."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest
import structlog

from api_sender import Sender, create_pool
from tests.support.hub import Hub
from tests.support.postgres import (
    create_database,
    drop_database,
    ensure_template,
    server_url,
    with_database,
)

os.environ.pop("DATABASE_URL", None)

#: Where xdist workers write each grouped test's ``xdist_group`` name for the controller.
GROUPS_ENV = "CHASSIS_XDIST_GROUPS"


# --- ``--dist loadgroup``, made to work again -------------------------------------------------
#
# pytest-xdist 3.8 tags a grouped test by renaming its node id, which pytest 9.2 no longer lets
# it do (pytest-dev/pytest-xdist#1386), so every test is scheduled on its own and a group's
# tests land on all workers, where they queue on the group's lock below with their workers idle.
# Instead, each worker writes the groups it collected to a file, and the controller schedules
# with xdist's own scope scheduler, one scope per group: a group runs on one worker, start to
# end, and the largest group starts first.


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER") and config.getoption("dist", "no") == "loadgroup":
        os.environ[GROUPS_ENV] = tempfile.mkdtemp(prefix="chassis-groups-")


def pytest_unconfigure(config: pytest.Config) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER") and (folder := os.environ.pop(GROUPS_ENV, None)):
        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    worker, folder = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get(GROUPS_ENV)
    if not worker or not folder:
        return
    groups = {item.nodeid: _group_of(item) for item in items}
    scratch = os.path.join(folder, f"{worker}.tmp")
    with open(scratch, "w") as f:
        json.dump({k: v for k, v in groups.items() if v is not None}, f)
    os.replace(scratch, os.path.join(folder, f"{worker}.json"))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    folder = os.environ.get(GROUPS_ENV)
    if folder is None:
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """One scope per ``xdist_group``; every other test is a scope of its own."""

        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                # Called once every worker has collected (and so written its file).
                self._groups = {}
                for name in sorted(os.listdir(folder)):
                    if name.endswith(".json"):
                        with open(os.path.join(folder, name)) as f:
                            self._groups.update(json.load(f))
            return self._groups.get(nodeid, nodeid)

    return GroupScheduling(config, log)


def _group_of(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    if marker is None:
        return None
    return str(marker.args[0] if marker.args else marker.kwargs.get("name", "group"))


@pytest.fixture(autouse=True)
def serialised_group(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Tests marked ``xdist_group(name)`` never run side by side across xdist workers.

    They start several daemon processes each; run side by side they would exceed the test
    server's connections. The scheduler above keeps a group on one worker; this lock per group
    name holds even when another ``--dist`` mode spreads them.
    """
    name = _group_of(request.node)
    if name is None or not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
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


@pytest.fixture
def hub() -> Iterator[Hub]:
    """A healthy hub on loopback (a real HTTP server a test can make fail, hang or answer
    held), stopped after the test."""
    server = Hub().start()
    try:
        yield server
    finally:
        server.stop()
