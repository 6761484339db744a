"""Shared by every benchmark: scratch databases, the worker daemon, percentiles, medians."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

import anyio
import asyncpg

from worker.declarations import JobDeclaration
from worker.install import install
from worker.jobs.tools import tool_job

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "jobs"
RUNS = 3


def admin_url() -> str:
    """The maintenance database of the server the benchmarks run on."""
    explicit = os.environ.get("BENCH_DATABASE_URL")
    if explicit:
        return explicit
    user = os.environ.get("PGUSER", "postgres")
    return f"postgresql://{user}@127.0.0.1:5432/postgres"


def with_database(url: str, database: str) -> str:
    """``url`` pointing at ``database`` instead."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, parts.fragment))


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
    """The median (the middle one of three runs)."""
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Daemon:
    """One ``python -m worker run`` process started by a benchmark."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self.process.pid

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until /readyz answers 200 (install done, listener up)."""
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.port}/readyz"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited {self.process.returncode}:\n{self.logs()}")
            try:
                with urllib.request.urlopen(url, timeout=1.0) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"worker not ready after {timeout}s:\n{self.logs()}")

    def peak_rss_bytes(self) -> int:
        """VmHWM: the most resident memory the process has had so far."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM in /proc status")

    def logs(self) -> str:
        """Everything the process wrote."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait (SIGKILL after ``timeout``)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return int(self.process.returncode)


def start_worker(database_url: str, tool_jobs: str, env: Mapping[str, str] | None = None) -> Daemon:
    """Start the real daemon (role worker) with ``TOOL_JOBS=tool_jobs`` on ``database_url``."""
    port = free_port()
    full_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DATABASE_", "SERVICE_", "TOOL_", "POLL_", "LOG_"))
    }
    full_env.update(
        DATABASE_URL=database_url,
        SERVICE_ROLE="worker",
        TOOL_JOBS=tool_jobs,
        HTTP_PORT=str(port),
        LOG_FORMAT="json",
        LOG_LEVEL="warning",
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    full_env.update(env or {})
    workdir = Path(tempfile.mkdtemp(prefix="chassis-bench-"))
    log_path = workdir / "worker.log"
    with log_path.open("wb") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "worker", "run"],
            env=full_env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            cwd=workdir,
        )
    return Daemon(process, port, log_path)
