"""The drain of 60,000 no-op jobs by one real worker process, and its peak RSS."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import asyncpg

from api_sender import Sender
from tests.support.processes import Daemon

from . import cpu
from .common import admin_url, install_queues, scratch_database, start_worker
from .noop import DRAIN, DRAIN_BATCH, DRAIN_CONCURRENCY, DRAIN_QUEUE

DRAIN_JOBS = 60_000
FILL_CHUNK = 5_000
DRAIN_TIMEOUT = 300.0

#: What ``describe`` says about the worker's settings in the output.
SETTINGS = f"batch_size={DRAIN_BATCH}, concurrency={DRAIN_CONCURRENCY}"


@dataclass(frozen=True, slots=True)
class DrainResult:
    """One drain: its rate from the database's clock and the worker's peak RSS."""

    jobs: int
    seconds: float
    peak_rss_bytes: int

    @property
    def rate(self) -> float:
        """Jobs per second, first claim to last completion."""
        return self.jobs / self.seconds


_FINISHED = """
SELECT NOT EXISTS (SELECT 1 FROM jobs.job WHERE queue = $1 AND state < 'active')
   AND NOT EXISTS (SELECT 1 FROM jobs.job WHERE queue = $1 AND state = 'active')
"""

_SPAN = """
SELECT count(*) FILTER (WHERE state = 'completed') AS done,
       extract(epoch FROM max(completed_at) - min(started_at))::float8 AS seconds
FROM jobs.job WHERE queue = $1
"""


async def fill(url: str, jobs: int) -> None:
    """Send ``jobs`` no-op jobs to the drain queue (before any worker runs)."""
    async with Sender.connect(url, min_size=1, max_size=1) as sender:
        for i in range(0, jobs, FILL_CHUNK):
            await sender.send_many(DRAIN_QUEUE, [{"n": n} for n in range(i, i + FILL_CHUNK)])


async def wait_finished(conn: asyncpg.Connection, queue: str, timeout: float) -> None:
    """Poll (every 0.25 s, two index probes) until no job of ``queue`` waits or runs."""
    deadline = time.monotonic() + timeout
    while not await conn.fetchval(_FINISHED, queue):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{queue} not drained after {timeout}s")
        await anyio.sleep(0.25)


@asynccontextmanager
async def _filled(name: str) -> AsyncIterator[tuple[str, asyncpg.Connection]]:
    """A fresh database with the drain's jobs sent, vacuumed and analysed, and a connection to
    watch it."""
    async with scratch_database(name) as url:
        await install_queues(url, DRAIN)
        await fill(url, DRAIN_JOBS)
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("VACUUM ANALYZE jobs.job")
            yield url, conn
        finally:
            await conn.close()


@asynccontextmanager
async def _worker(
    url: str, python: str | None, batch: int, concurrency: int
) -> AsyncIterator[Daemon]:
    """One worker process on the drain queue (its size through benchmarks.noop's overrides)."""
    sizes = {"BENCH_DRAIN_BATCH": str(batch), "BENCH_DRAIN_CONCURRENCY": str(concurrency)}
    daemon = start_worker(url, "benchmarks.noop:DRAIN", sizes, python=python)
    try:
        yield daemon
    finally:
        daemon.stop()


async def drain_once(
    python: str | None = None,
    *,
    batch: int = DRAIN_BATCH,
    concurrency: int = DRAIN_CONCURRENCY,
) -> DrainResult:
    """Fill a fresh database, start one worker, time its drain from the database (``python``:
    the worker's interpreter, default this one; ``batch``/``concurrency``: the drain queue's
    declaration, through benchmarks.noop's environment overrides)."""
    async with _filled("drain") as (url, conn):
        async with _worker(url, python, batch, concurrency) as daemon:
            await wait_finished(conn, DRAIN_QUEUE, DRAIN_TIMEOUT)
            rss = daemon.peak_rss_bytes()
        row = await conn.fetchrow(_SPAN, DRAIN_QUEUE)
    assert row is not None
    if row["done"] != DRAIN_JOBS:
        raise RuntimeError(f"drain completed {row['done']} of {DRAIN_JOBS} jobs")
    return DrainResult(DRAIN_JOBS, row["seconds"], rss)


@dataclass(frozen=True, slots=True)
class DrainCpu:
    """CPU time per job of one drain: the worker process's and the database server's (all of
    its processes), from the queue's resume to its last completion, boot excluded."""

    worker_us_per_job: float
    server_us_per_job: float


async def drain_cpu_once(
    python: str | None = None,
    *,
    batch: int = DRAIN_BATCH,
    concurrency: int = DRAIN_CONCURRENCY,
) -> DrainCpu | None:
    """The drain of :func:`drain_once`, with the queue paused until the worker is ready, so the
    CPU counted is the drain's own (``None`` when the server does not run on this machine)."""
    postmaster = await cpu.postmaster_of(admin_url())
    if postmaster is None:
        return None
    async with _filled("drain-cpu") as (url, conn), Sender.connect(url, max_size=1) as sender:
        await sender.queues.pause(DRAIN_QUEUE)
        async with _worker(url, python, batch, concurrency) as daemon:
            await anyio.to_thread.run_sync(daemon.wait_ready, 60.0)
            worker0, server0 = cpu.process_seconds(daemon.pid), cpu.server_seconds(postmaster)
            await sender.queues.resume(DRAIN_QUEUE)
            await wait_finished(conn, DRAIN_QUEUE, DRAIN_TIMEOUT)
            worker1, server1 = cpu.process_seconds(daemon.pid), cpu.server_seconds(postmaster)
    per_job = 1e6 / DRAIN_JOBS
    return DrainCpu((worker1 - worker0) * per_job, (server1 - server0) * per_job)
