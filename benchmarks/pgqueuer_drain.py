"""Runs INSIDE the pgqueuer peer venv (``benchmarks/.peers/pgqueuer``), never in ours.

``python pgqueuer_drain.py fill DSN JOBS`` installs pgqueuer's schema and enqueues ``JOBS`` jobs
of entrypoint ``noop``; ``python pgqueuer_drain.py drain DSN BATCH`` runs pgqueuer's documented
worker entry point, ``pgqueuer.run(factory, batch_size=BATCH, mode=drain)``, on uvloop (as its
``pgq run`` does when uvloop is installed) with a no-op entrypoint, until the queue is empty.
Only pgqueuer's public API is used; the timing is read by the caller from pgqueuer's log table.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import uvloop
from pgqueuer import PgQueuer, Queries, run
from pgqueuer.db import AsyncpgDriver
from pgqueuer.domain.types import QueueExecutionMode
from pgqueuer.models import Job

CHUNK = 5_000


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
    """Dispatch ``fill`` or ``drain``."""
    command, dsn, number = argv
    if command == "fill":
        uvloop.run(fill(dsn, int(number)))
    elif command == "drain":
        drain(dsn, int(number))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
