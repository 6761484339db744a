"""graphile-worker side by side: installed from the npm registry into its own directory under
``benchmarks/.peers/``, driven by our Node script ``benchmarks/graphile_peer.mjs``, each figure
on a fresh scratch database of its own and timed as ours is.

* drain: 60,000 no-op jobs added (``addJobs``) before one ``run()`` process starts; jobs/s from
  the first task's first line to the moment the job table is empty (graphile-worker deletes a
  job when it completes, so there is no completion time to read back: the script polls every
  20 ms). With its documented batched settings (``BATCHED``) and with its defaults.
* batch add: ``addJobs`` of 20,000 in one call and in calls of 1,000 (after a 10-job warm-up);
  single add: ``addJob`` awaited in sequence, p50/p99, after 200 warm-up adds.
* pickup: ``run()`` in one process, a producer process calling ``addJob`` at 100 jobs/s with the
  wall-clock time just before the call, the task's first line reporting ``now - t`` over UDP.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import asyncpg

from .common import scratch_database
from .latency import collecting
from .peer import PEERS

DIR = PEERS / "graphile-worker"
SCRIPT = Path(__file__).with_name("graphile_peer.mjs")
WANTED = "graphile-worker@0.18"
JOBS = 60_000
#: The drain with its defaults runs one job at a time (1,400 jobs/s on a quiet machine, under
#: 300 under load): a smaller queue keeps ``make bench`` within minutes; the rate is per job.
DEFAULTS_JOBS = 20_000
#: What the output says the two modes are.
BATCHED = (
    "localQueue.size 500, completeJobBatchDelay 0, failJobBatchDelay 0, concurrentJobs 24,"
    " maxPoolSize 25"
)
DEFAULTS = "concurrentJobs 1, maxPoolSize 10, no local queue, unbatched completions"


def ensure_installed() -> str:
    """Install graphile-worker 0.18.x from npm into ``DIR`` on first use (``npm install``, the
    registry's ordinary client); copy our script there; return the installed version."""
    if _version() is None:
        DIR.mkdir(parents=True, exist_ok=True)
        manifest = DIR / "package.json"
        if not manifest.exists():
            manifest.write_text(json.dumps({"private": True, "type": "module"}) + "\n")
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", WANTED],
            cwd=DIR,
            check=True,
        )
    version = _version()
    if version is None:
        raise RuntimeError(f"graphile-worker did not install into {DIR}")
    shutil.copyfile(SCRIPT, DIR / SCRIPT.name)
    return version


def _version() -> str | None:
    manifest = DIR / "node_modules" / "graphile-worker" / "package.json"
    if not manifest.exists():
        return None
    return str(json.loads(manifest.read_text())["version"])


def _node(*args: str, timeout: float) -> Any:
    """Run one command of the script; return the JSON it printed last (or ``None``)."""
    done = subprocess.run(
        ["node", SCRIPT.name, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=DIR,
    )
    if done.returncode != 0:
        raise RuntimeError(f"graphile-worker {args[0]} failed:\n{done.stdout}\n{done.stderr}")
    lines = done.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else None


async def _run(*args: str, timeout: float) -> Any:
    return await anyio.to_thread.run_sync(lambda: _node(*args, timeout=timeout))


@dataclass(frozen=True, slots=True)
class GraphileDrain:
    """One drain: jobs and seconds from the first task to an empty job table."""

    jobs: int
    seconds: float

    @property
    def rate(self) -> float:
        """Jobs per second."""
        return self.jobs / self.seconds


async def graphile_drain(mode: str, jobs: int = JOBS) -> GraphileDrain:
    """Fill a fresh database with ``jobs`` no-op jobs and drain them in one ``run()`` process
    (``mode`` ``batched`` or ``defaults``); the job table is vacuumed and analysed after the
    fill, as ours is."""
    async with scratch_database("graphile") as url:
        await _run("fill", url, str(jobs), timeout=300)
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("VACUUM ANALYZE graphile_worker._private_jobs")
        finally:
            await conn.close()
        out = await _run("drain", url, mode, str(jobs), timeout=900)
    return GraphileDrain(int(out["jobs"]), float(out["seconds"]))


@dataclass(frozen=True, slots=True)
class GraphileSend:
    """graphile-worker's producer figures, timed as ours are."""

    one_call: float
    chunked: float
    p50_ms: float
    p99_ms: float


async def graphile_send(total: int, chunk: int, sends: int) -> GraphileSend:
    """``addJobs`` of ``total`` jobs in one call and in calls of ``chunk``, then ``sends``
    single ``addJob`` calls in sequence; each on its own fresh database."""
    rates = []
    for size in (total, chunk):
        async with scratch_database("graphile") as url:
            out = await _run("batch", url, str(total), str(size), timeout=300)
        rates.append(float(out["rate"]))
    async with scratch_database("graphile") as url:
        out = await _run("single", url, str(sends), timeout=300)
    return GraphileSend(rates[0], rates[1], float(out["p50"]), float(out["p99"]))


async def graphile_pickup(
    jobs: int, rate: float, warmup: int, mode: str = "defaults"
) -> tuple[float, float]:
    """p50 and p99 (ms) of graphile-worker's pickup, measured as ``benchmarks.latency``
    measures ours; the first ``warmup`` are dropped."""
    async with collecting() as collector, scratch_database("graphile") as url:
        await _run("install", url, timeout=120)
        server = subprocess.Popen(
            ["node", SCRIPT.name, "serve", url, mode, f"127.0.0.1:{collector.port}"],
            cwd=DIR,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            # Probe jobs until one comes back: the schema is migrated and the runner listens.
            deadline = time.monotonic() + 60.0
            while not collector.samples:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("graphile-worker never picked up the probe job")
                await _run("produce", url, "1", "1", timeout=60)
                await collector.arrivals(1, 2.0)
            collector.samples.clear()
            total = warmup + jobs
            await _run("produce", url, str(total), str(rate), timeout=total / rate + 60)
            await collector.arrivals(total, 10.0)
        finally:
            server.terminate()
            try:
                await anyio.to_thread.run_sync(lambda: server.wait(10))
            except subprocess.TimeoutExpired:
                server.kill()
                await anyio.to_thread.run_sync(server.wait)
    return collector.figures(warmup, jobs, "graphile-worker")
