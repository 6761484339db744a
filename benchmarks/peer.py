"""pgqueuer side by side: its own venv under ``benchmarks/.peers/``, its drain and its producer
timed like ours."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
import asyncpg

from tests.support.processes import ROOT

from .common import scratch_database
from .latency import collecting

PEERS = ROOT / "benchmarks" / ".peers"
VENV = PEERS / "pgqueuer"
PYTHON = VENV / "bin" / "python"
SCRIPT = Path(__file__).with_name("pgqueuer_peer.py")
#: The requested version; the newest release is taken when no 1.6.x exists.
WANTED = "pgqueuer[asyncpg]==1.6.*"
FALLBACK = "pgqueuer[asyncpg]"
BATCH = 50
JOBS = 60_000

_SPAN = """
SELECT (SELECT count(*) FROM pgqueuer_log WHERE status = 'successful') AS done,
       extract(epoch FROM (SELECT max(created) FROM pgqueuer_log WHERE status = 'successful')
                        - (SELECT min(created) FROM pgqueuer_log WHERE status = 'picked'))::float8
           AS seconds
"""


def make_venv(venv: Path) -> None:
    """Create a venv at ``venv`` (under ``benchmarks/.peers/``) unless it exists."""
    if not (venv / "bin" / "python").exists():
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)


def ensure_venv() -> str:
    """Create the peer venv on first use; return the installed pgqueuer version."""
    make_venv(VENV)
    pip = [str(PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    if _version() is None:
        done = subprocess.run([*pip, WANTED, "uvloop"], check=False, capture_output=True)
        if done.returncode != 0:
            subprocess.run([*pip, FALLBACK, "uvloop"], check=True)
    version = _version()
    if version is None:
        raise RuntimeError("pgqueuer did not install into the peer venv")
    return version


def _version() -> str | None:
    done = subprocess.run(
        [str(PYTHON), "-c", "import importlib.metadata as m; print(m.version('pgqueuer'))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else None


@dataclass(frozen=True, slots=True)
class PeerDrain:
    """One pgqueuer drain, timed from its log table, and the draining process's peak RSS."""

    jobs: int
    seconds: float
    peak_rss_bytes: int

    @property
    def rate(self) -> float:
        """Jobs per second, first pick to last success."""
        return self.jobs / self.seconds


def _peer(*args: str, timeout: float) -> None:
    _peer_output(*args, timeout=timeout)


def _peer_output(*args: str, timeout: float) -> str:
    """Run the peer script in its venv; return what it printed."""
    done = subprocess.run(
        [str(PYTHON), str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=PEERS,
    )
    if done.returncode != 0:
        raise RuntimeError(f"pgqueuer {args[0]} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


async def pgqueuer_drain() -> PeerDrain:
    """Fill a fresh database with 60,000 jobs, drain them with ``pgqueuer.run``, batch 50."""
    async with scratch_database("pgqueuer") as url:
        await anyio.to_thread.run_sync(lambda: _peer("fill", url, str(JOBS), timeout=300))
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("VACUUM ANALYZE pgqueuer")
            started = time.monotonic()
            out = await anyio.to_thread.run_sync(
                lambda: _peer_output("drain", url, str(BATCH), timeout=600)
            )
            wall = time.monotonic() - started
            row = await conn.fetchrow(_SPAN)
        finally:
            await conn.close()
    assert row is not None
    if row["done"] != JOBS:
        raise RuntimeError(f"pgqueuer completed {row['done']} of {JOBS} jobs in {wall:.1f}s")
    peak = json.loads(out.strip().splitlines()[-1])["peak_rss_kib"] * 1024
    return PeerDrain(JOBS, row["seconds"], peak)


@dataclass(frozen=True, slots=True)
class PeerSend:
    """pgqueuer's producer figures, timed as ours are."""

    chunked: float
    p50_ms: float
    p99_ms: float


async def pgqueuer_send(sends: int) -> PeerSend:
    """On a fresh database: 20,000 jobs in enqueue calls of 1,000, then ``sends`` single
    enqueues in sequence on one connection (pgqueuer's driver wraps one connection)."""
    async with scratch_database("pgqueuer") as url:
        out = await anyio.to_thread.run_sync(
            lambda: _peer_output("send", url, str(sends), timeout=300)
        )
    figures = json.loads(out.strip().splitlines()[-1])
    return PeerSend(float(figures["chunked"]), float(figures["p50"]), float(figures["p99"]))


async def pgqueuer_pickup(jobs: int, rate: float, warmup: int) -> tuple[float, float]:
    """p50 and p99 (ms) of pgqueuer's pickup, measured as ``benchmarks.latency`` measures ours:
    ``pgqueuer.run`` in one process, a producer enqueuing at ``rate`` in another, and each
    handler's first line reporting ``now - sent`` over UDP. The first ``warmup`` are dropped."""
    async with collecting() as collector, scratch_database("pgqueuer") as url:
        await anyio.to_thread.run_sync(lambda: _peer("install", url, timeout=120))
        server = subprocess.Popen(
            [str(PYTHON), str(SCRIPT), "serve", url, f"127.0.0.1:{collector.port}"],
            cwd=PEERS,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            # pgqueuer says nothing when it is listening: it is once a probe job comes back.
            await anyio.to_thread.run_sync(lambda: _peer("produce", url, "1", "1", timeout=60))
            await collector.arrivals(1, 30.0)
            if not collector.samples:
                raise RuntimeError("pgqueuer never picked up the probe job")
            collector.samples.clear()
            total = warmup + jobs
            await anyio.to_thread.run_sync(
                lambda: _peer("produce", url, str(total), str(rate), timeout=total / rate + 60)
            )
            await collector.arrivals(total, 10.0)
        finally:
            server.terminate()
            try:
                await anyio.to_thread.run_sync(lambda: server.wait(10))
            except subprocess.TimeoutExpired:
                server.kill()
                await anyio.to_thread.run_sync(server.wait)
    return collector.figures(warmup, jobs, "pgqueuer")
