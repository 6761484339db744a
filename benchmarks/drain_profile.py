"""Where the drain's time goes: ``python -m benchmarks.drain_profile [JOBS]``.

One drain as ``benchmarks.drain`` runs it (a fresh database, the jobs sent first, one real
worker process), with two recorders:

* the database's own time per statement, from ``pg_stat_statements`` (reset after the fill, read
  before the database is dropped; only the drained database's statements are shown). The
  server must preload it (``shared_preload_libraries = 'pg_stat_statements'``), which takes a
  restart: point ``BENCH_DATABASE_URL`` at a throwaway server (``initdb`` on a loopback port),
  never change a shared one;
* the worker process's own time, sampled by ``py-spy record`` (``PY_SPY`` names the binary; it
  is not one of our dependencies), which starts the worker as its child, into
  ``$DRAIN_PROFILE_DIR/drain-profile.collapsed.txt`` (collapsed stacks; default ``artifacts/``),
  summarised as the top functions by own and by inclusive samples.

Figures are from one run on a shared machine: read them as shares, not as rates.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import asyncpg

from tests.support.processes import base_env, free_port
from worker.logging import configure_logging

from .common import admin_url, install_queues, scratch_database
from .drain import _SPAN, DRAIN_TIMEOUT, fill, wait_finished
from .noop import DRAIN, DRAIN_QUEUE

OUT = Path(os.environ.get("DRAIN_PROFILE_DIR", "artifacts"))

_STATEMENTS = """
SELECT calls, rows, total_exec_time, mean_exec_time, total_plan_time,
       shared_blks_hit, shared_blks_dirtied, wal_bytes,
       regexp_replace(query, '\\s+', ' ', 'g') AS query
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY total_exec_time DESC
LIMIT 15
"""


async def profile(jobs: int) -> None:
    """Drain ``jobs`` no-op jobs with both recorders on; print what they saw."""
    py_spy = os.environ.get("PY_SPY", "py-spy")
    OUT.mkdir(parents=True, exist_ok=True)
    print(f"server {admin_url()}", flush=True)
    async with scratch_database("profile") as url:
        await install_queues(url, DRAIN)
        await fill(url, jobs)
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            await conn.execute("VACUUM ANALYZE jobs.job")
            await conn.execute("SELECT pg_stat_statements_reset()")
            worker, spy = _start_profiled(url, py_spy)
            try:
                started = time.monotonic()
                await wait_finished(conn, DRAIN_QUEUE, DRAIN_TIMEOUT)
                wall = time.monotonic() - started
            finally:
                # The worker stops gracefully; py-spy writes its file when its child exits.
                if worker is not None:
                    os.kill(worker, signal.SIGTERM)
                await anyio.to_thread.run_sync(lambda: spy.wait(60))
            span = await conn.fetchrow(_SPAN, DRAIN_QUEUE)
            rows = await conn.fetch(_STATEMENTS)
        finally:
            await conn.close()
    assert span is not None
    print(
        f"drained {span['done']:,} jobs in {span['seconds']:.2f} s"
        f" ({span['done'] / span['seconds']:,.0f} jobs/s; {wall:.1f} s with start-up)"
    )
    total = sum(r["total_exec_time"] for r in rows)
    print("\npg_stat_statements (this database, top by total execution time):")
    print(
        f"{'calls':>7} {'rows':>8} {'total ms':>9} {'share':>6} {'mean ms':>8}"
        f" {'plan ms':>8}  query"
    )
    for r in rows:
        print(
            f"{r['calls']:>7} {r['rows']:>8} {r['total_exec_time']:>9.0f}"
            f" {r['total_exec_time'] / total:>6.0%} {r['mean_exec_time']:>8.2f}"
            f" {r['total_plan_time']:>8.0f}  {r['query'][:150]}"
        )
    summarize(OUT / "drain-profile.collapsed.txt")


def _start_profiled(url: str, py_spy: str) -> tuple[int | None, subprocess.Popen[bytes]]:
    """``python -m worker run`` (role worker, the drain's tool jobs, the benchmark's settings)
    as a child of ``py-spy record`` (attaching to a running process is refused here; starting
    it under py-spy is not). Returns the worker's pid (py-spy's child) and py-spy's process."""
    env = base_env(
        url,
        fast=False,
        SERVICE_ROLE="worker",
        TOOL_JOBS="benchmarks.noop:DRAIN",
        HTTP_PORT=str(free_port()),
    )
    workdir = Path(tempfile.mkdtemp(prefix="chassis-profile-"))
    spy = subprocess.Popen(
        [
            py_spy,
            "record",
            "--rate",
            "250",
            "--format",
            "raw",
            "--output",
            str((OUT / "drain-profile.collapsed.txt").resolve()),
            "--",
            sys.executable,
            "-m",
            "worker",
            "run",
        ],
        env=env,
        cwd=workdir,
        stdout=(workdir / "worker.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        children = Path(f"/proc/{spy.pid}/task/{spy.pid}/children")
        found = children.read_text().split() if children.exists() else []
        if found:
            return int(found[0]), spy
        time.sleep(0.01)
    return None, spy


def summarize(path: Path, top: int = 25) -> None:
    """Top functions of a py-spy collapsed-stack file, by own and by inclusive samples."""
    if not path.exists():
        print(f"\nno py-spy output at {path}")
        return
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = stack.split(";")
        samples += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    print(f"\npy-spy: {samples} samples of the worker's threads")
    for title, counter in (("own", own), ("inclusive", inclusive)):
        print(f"\ntop {top} by {title} samples:")
        for frame, n in counter.most_common(top):
            print(f"{n / samples:>6.1%}  {frame}")


def main() -> int:
    """Run one profiled drain (``JOBS`` from argv, 60,000 by default)."""
    configure_logging("warning", "console")
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 60_000
    anyio.run(profile, jobs, backend_options={"use_uvloop": True})
    return 0


if __name__ == "__main__":
    sys.exit(main())
