"""Runs INSIDE the pgqueuer peer venv (``benchmarks/.peers/pgqueuer``), never in ours.

``python pgqueuer_peer.py fill DSN JOBS`` installs pgqueuer's schema and enqueues ``JOBS`` jobs
of entrypoint ``noop``; ``python pgqueuer_peer.py drain DSN BATCH`` runs pgqueuer's documented
worker entry point, ``pgqueuer.run(factory, batch_size=BATCH, mode=drain)``, on uvloop (as its
``pgq run`` does when uvloop is installed) with a no-op entrypoint, until the queue is empty,
then prints its peak RSS as one JSON line; the timing is read by the caller from pgqueuer's log
table. ``python pgqueuer_peer.py send DSN SENDS`` installs the schema and times the producer as
``benchmarks.enqueue`` times ours: 20,000 jobs in ``Queries.enqueue`` calls of 1,000, then
``SENDS`` single enqueues awaited one after another after a warm-up; it prints one JSON line.
``install DSN``, ``serve DSN HOST:PORT`` and ``produce DSN JOBS RATE`` measure pickup latency as
``benchmarks.latency`` does for ours (see ``serve``). Only pgqueuer's public API is used.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import uvloop
from pgqueuer import PgQueuer, Queries, run
from pgqueuer.db import AsyncpgDriver
from pgqueuer.domain.types import QueueExecutionMode
from pgqueuer.models import Job

CHUNK = 5_000
#: As benchmarks/enqueue.py: the batch figure, its chunk, and the single sends' warm-up.
MANY = 20_000
MANY_CHUNK = 1_000
WARMUP = 200


async def fill(dsn: str, jobs: int) -> None:
    """Install the schema and enqueue ``jobs`` small jobs."""
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        for i in range(0, jobs, CHUNK):
            n = min(CHUNK, jobs - i)
            payloads: list[bytes | None] = [b'{"n":%d}' % k for k in range(i, i + n)]
            await queries.enqueue(["noop"] * n, payloads, [0] * n)
    finally:
        await conn.close()


async def send(dsn: str, sends: int) -> dict[str, float]:
    """Jobs/s of 20,000 jobs in calls of 1,000, and p50/p99 (ms) of ``sends`` single enqueues."""
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        await queries.enqueue(["noop"] * 10, [b'{"n":0}'] * 10, [0] * 10)
        started = time.perf_counter()
        for i in range(0, MANY, MANY_CHUNK):
            payloads: list[bytes | None] = [b'{"n":%d}' % k for k in range(i, i + MANY_CHUNK)]
            await queries.enqueue(["noop"] * MANY_CHUNK, payloads, [0] * MANY_CHUNK)
        chunked = MANY / (time.perf_counter() - started)
        for i in range(WARMUP):
            await queries.enqueue("noop", b'{"n":%d}' % i, 0)
        samples = []
        for i in range(sends):
            began = time.perf_counter()
            await queries.enqueue("noop", b'{"n":%d}' % i, 0)
            samples.append(time.perf_counter() - began)
    finally:
        await conn.close()
    return {
        "chunked": chunked,
        "p50": _nearest_rank(samples, 50) * 1000,
        "p99": _nearest_rank(samples, 99) * 1000,
    }


def _nearest_rank(values: list[float], q: int) -> float:
    """As benchmarks.common.percentile (this file cannot import our package)."""
    ordered = sorted(values)
    return ordered[max(1, min(len(ordered), -(-q * len(ordered) // 100))) - 1]


def drain(dsn: str, batch: int) -> None:
    """Drain the queue with ``pgqueuer.run`` and a no-op entrypoint."""

    @asynccontextmanager
    async def factory() -> AsyncIterator[PgQueuer]:
        conn = await asyncpg.connect(dsn)
        pgq = PgQueuer(AsyncpgDriver(conn))

        @pgq.entrypoint("noop")
        async def noop(job: Job) -> None:
            return None

        try:
            yield pgq
        finally:
            await conn.close()

    uvloop.run(run(factory, batch_size=batch, mode=QueueExecutionMode.drain))
    print(json.dumps({"peak_rss_kib": _peak_rss_kib()}))


def _peak_rss_kib() -> int:
    """This process's peak resident set (``VmHWM``), as the benchmark reads our worker's."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def serve(dsn: str, addr: str) -> None:
    """Run ``pgqueuer.run`` (continuous, its defaults) with an entrypoint that sends each job's
    pickup latency, ``time.time()`` at its first line less the ``t`` its payload carries, as one
    UDP datagram to ``addr`` (as benchmarks/noop.py's handler does for ours). Runs until killed.
    """
    host, port = addr.rsplit(":", 1)
    target = (host, int(port))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    @asynccontextmanager
    async def factory() -> AsyncIterator[PgQueuer]:
        conn = await asyncpg.connect(dsn)
        pgq = PgQueuer(AsyncpgDriver(conn))

        @pgq.entrypoint("pickup")
        async def pickup(job: Job) -> None:
            now = time.time()
            sent = json.loads(job.payload or b"{}")["t"]
            sock.sendto(repr(now - sent).encode(), target)

        try:
            yield pgq
        finally:
            await conn.close()

    uvloop.run(run(factory))


async def produce(dsn: str, jobs: int, rate: float) -> None:
    """Enqueue ``jobs`` jobs of entrypoint ``pickup`` at ``rate`` per second, one at a time,
    each carrying the wall-clock time just before its enqueue (as benchmarks/latency.py)."""
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        start = time.monotonic()
        for i in range(jobs):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await queries.enqueue("pickup", json.dumps({"t": time.time()}).encode(), 0)
    finally:
        await conn.close()


async def install(dsn: str) -> None:
    """Install pgqueuer's schema."""
    conn = await asyncpg.connect(dsn)
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


def main(argv: list[str]) -> None:
    """Dispatch ``fill``, ``drain``, ``send``, ``install``, ``serve`` or ``produce``."""
    command, dsn, *rest = argv
    if command == "fill":
        uvloop.run(fill(dsn, int(rest[0])))
    elif command == "send":
        print(json.dumps(uvloop.run(send(dsn, int(rest[0])))))
    elif command == "drain":
        drain(dsn, int(rest[0]))
    elif command == "install":
        uvloop.run(install(dsn))
    elif command == "serve":
        serve(dsn, rest[0])
    elif command == "produce":
        uvloop.run(produce(dsn, int(rest[0]), float(rest[1])))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
