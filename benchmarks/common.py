"""Shared by every benchmark: scratch databases, the worker daemon, percentiles, medians.

Processes and database URLs come from the tests' own harness (tests/support), so a fix there
(free_port never handing out one port twice, wait_ready counting only the daemon's own
listener) holds here too.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

import anyio
import asyncpg

from tests.support.postgres import server_url, with_database
from tests.support.processes import Daemon, start_daemon
from worker.declarations import JobDeclaration
from worker.install import install
from worker.jobs.tools import tool_job

SCHEMA = "jobs"
#: Each figure is measured this many times, the runs interleaved (issues 12 and 14 ask for 5).
RUNS = 5


def admin_url() -> str:
    """The maintenance database of the server the benchmarks run on: BENCH_DATABASE_URL, else
    the tests' server (TEST_DATABASE_URL, 127.0.0.1:5432, or the embedded server)."""
    return os.environ.get("BENCH_DATABASE_URL") or server_url()


#: What a server restart mid-figure looks like (other developers' drills restart PostgreSQL).
T = TypeVar("T")

SERVER_GONE: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
)


async def admin_connect(timeout: float = 120.0) -> asyncpg.Connection:
    """A connection to the maintenance database, waiting out a server restart."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await asyncpg.connect(admin_url())
        except SERVER_GONE:
            if time.monotonic() > deadline:
                raise
            await anyio.sleep(1.0)


@asynccontextmanager
async def scratch_database(prefix: str = "bench") -> AsyncIterator[str]:
    """A new empty database for one figure; dropped (with anything still connected) after it."""
    name = f"chassis_{prefix}_{uuid.uuid4().hex[:12]}"
    admin = await admin_connect()
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        yield with_database(admin_url(), name)
    finally:
        with anyio.CancelScope(shield=True):
            admin = await admin_connect()
            try:
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            finally:
                await admin.close()


class ServerRestarted(Exception):
    """A figure could not be measured: the server went away in every attempt."""


async def surviving_restarts(measure: Callable[[], Awaitable[T]], attempts: int = 3) -> T:
    """Run one measurement; if PostgreSQL restarts under it, wait for it and measure again."""
    for attempt in range(attempts):
        try:
            return await measure()
        except (*SERVER_GONE, RuntimeError) as exc:
            if isinstance(exc, RuntimeError) and "connection" not in str(exc).lower():
                raise
            print(f"  (server went away: {type(exc).__name__}; measuring again)", flush=True)
            if attempt + 1 == attempts:
                raise ServerRestarted(str(exc)) from exc
            await anyio.sleep(2.0)
            await (await admin_connect()).close()
    raise AssertionError("unreachable")


async def install_queues(url: str, declarations: Sequence[JobDeclaration]) -> None:
    """Migrate ``url`` and create the queues of ``declarations`` as a worker's install would."""
    await install(url, SCHEMA, [tool_job(d) for d in declarations], cron_tz="UTC", lock_timeout=60)


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of ``values``."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    """The median (the middle one of the runs)."""
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def start_worker(
    database_url: str,
    tool_jobs: str,
    env: Mapping[str, str] | None = None,
    *,
    python: str | None = None,
) -> Daemon:
    """Start the real daemon (role worker unless ``env`` says otherwise) with
    ``TOOL_JOBS=tool_jobs`` on ``database_url``: the tests' harness with the daemon's default
    timings and warning-level logs, in a fresh temporary directory (``python``: another
    interpreter, see :func:`tests.support.processes.start_daemon`)."""
    workdir = Path(tempfile.mkdtemp(prefix="chassis-bench-"))
    return start_daemon(
        database_url,
        workdir,
        role="worker",
        env={"TOOL_JOBS": tool_jobs, **dict(env or {})},
        name="worker",
        fast=False,
        python=python,
    )
