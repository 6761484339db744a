"""Runs INSIDE the pgqueuer peer venv (``benchmarks/.peers/pgqueuer``), never in ours.

``python pgqueuer_peer.py fill DSN JOBS`` installs pgqueuer's schema and enqueues ``JOBS`` jobs
of entrypoint ``noop``; ``python pgqueuer_peer.py drain DSN BATCH`` runs pgqueuer's documented
worker entry point, ``pgqueuer.run(factory, batch_size=BATCH, mode=drain)``, on uvloop (as its
``pgq run`` does when uvloop is installed) with a no-op entrypoint, until the queue is empty;
the timing is read by the caller from pgqueuer's log table. ``python pgqueuer_peer.py send DSN
SENDS`` installs the schema and times the producer as ``benchmarks.enqueue`` times ours: 20,000
jobs in ``Queries.enqueue`` calls of 1,000, then ``SENDS`` single enqueues awaited one after
another after a warm-up; it prints one JSON line. Only pgqueuer's public API is used.
"""

from __future__ import annotations

import json
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


def main(argv: list[str]) -> None:
    """Dispatch ``fill``, ``drain`` or ``send``."""
    command, dsn, number = argv
    if command == "fill":
        uvloop.run(fill(dsn, int(number)))
    elif command == "send":
        print(json.dumps(uvloop.run(send(dsn, int(number)))))
    elif command == "drain":
        drain(dsn, int(number))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
