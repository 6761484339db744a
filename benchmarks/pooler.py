"""Through PgBouncer in transaction mode (issue 13), in the same sitting as direct.

PgBouncer (Debian's, started here on a loopback port, ``pool_mode = transaction``, 10 server
connections) in front of the benchmark server. The daemon runs as contract section 12 says:
``DATABASE_URL`` at PgBouncer, ``DATABASE_STATEMENT_CACHE_SIZE=0``, ``LISTEN_MODE=poll``,
``DATABASE_DIRECT_URL`` at the server; the producer is ``api_sender`` over a pool with no
statement cache. Each figure is taken direct and through the pooler, one after the other:

* drain: the 60,000 no-op jobs of ``benchmarks.drain`` by one worker;
* single ``send`` p50/p99: 5,000 sends awaited one after another, after a warm-up;
* pickup p50/p99 at ``POLL_INTERVAL_SECONDS`` 0.5 and 2 (poll mode: a job waits for the next
  probe, so p50 should be about half the interval), against direct with LISTEN/NOTIFY;
* idle commits per 30 s of a worker with nothing to do (poll mode through the pooler against
  notify mode direct; PgBouncer's own ``server_check_query`` counts too).

The cost of going through the pooler is stated as ratios to direct. ``BENCH_POOLER_RUNS``
(default 1) sets how many times each figure is taken.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import anyio
import asyncpg

from api_sender import Sender, create_pool
from tests.support.servers import PgBouncer, running_pgbouncer
from tests.support.tools import find_tool

from . import drain, enqueue, latency
from .common import install_queues, scratch_database, start_worker
from .noop import DRAIN, DRAIN_QUEUE, IDLE, LATENCY, LATENCY_QUEUE
from .report import Row, measured

RUNS = int(os.environ.get("BENCH_POOLER_RUNS", "1"))
IDLE_SETTLE = 15.0
IDLE_WINDOW = 30.0


def pooled_env(direct_url: str, poll: float | None = None) -> dict[str, str]:
    """A daemon behind the pooler: poll mode, no statement cache, the direct URL for sessions."""
    env = {
        "LISTEN_MODE": "poll",
        "DATABASE_STATEMENT_CACHE_SIZE": "0",
        "DATABASE_DIRECT_URL": direct_url,
    }
    if poll is not None:
        env["POLL_INTERVAL_SECONDS"] = str(poll)
    return env


@contextmanager
def bouncer() -> Iterator[PgBouncer]:
    """PgBouncer in front of 127.0.0.1:5432 for the whole benchmark."""
    binary = find_tool("pgbouncer")
    if binary is None:
        raise RuntimeError("pgbouncer is not installed: `apt-get install pgbouncer`")
    with running_pgbouncer(binary, "chassis-bench-pgbouncer-") as server:
        yield server


def through(server: PgBouncer, url: str) -> str:
    """``url``'s database through PgBouncer."""
    return server.url(url.rsplit("/", 1)[1])


async def drain_through(server: PgBouncer) -> float:
    """Jobs/s of the 60,000-job drain by one worker through the pooler."""
    async with scratch_database("pool_drain") as url:
        await install_queues(url, DRAIN)
        await drain.fill(url, drain.DRAIN_JOBS)
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("VACUUM ANALYZE jobs.job")
            daemon = start_worker(through(server, url), "benchmarks.noop:DRAIN", pooled_env(url))
            try:
                await drain.wait_finished(conn, DRAIN_QUEUE, drain.DRAIN_TIMEOUT)
            finally:
                daemon.stop()
            row = await conn.fetchrow(drain._SPAN, DRAIN_QUEUE)
        finally:
            await conn.close()
    assert row is not None
    if row["done"] != drain.DRAIN_JOBS:
        raise RuntimeError(f"drain completed {row['done']} of {drain.DRAIN_JOBS} jobs")
    return float(drain.DRAIN_JOBS / row["seconds"])


async def send_through(server: PgBouncer) -> tuple[float, float]:
    """p50 and p99 (ms) of single sends through the pooler, as ``enqueue.single_send_latency``."""
    async with scratch_database("pool_send") as url:
        await install_queues(url, DRAIN)
        pool = await create_pool(
            through(server, url), min_size=1, max_size=1, statement_cache_size=0
        )
        try:
            sender = Sender(pool)
            return await enqueue.time_in_sequence(lambda n: sender.send(DRAIN_QUEUE, {"n": n}))
        finally:
            await pool.close()


async def pickup_through(server: PgBouncer, poll: float) -> tuple[float, float]:
    """p50 and p99 (ms) of pickup through the pooler in poll mode at ``poll`` seconds."""
    async with latency.collecting() as collector, scratch_database("pool_pickup") as url:
        await install_queues(url, LATENCY)
        pooled = through(server, url)
        daemon = start_worker(
            pooled,
            "benchmarks.noop:LATENCY",
            {
                **pooled_env(url, poll),
                "BENCH_LATENCY_ADDR": f"127.0.0.1:{collector.port}",
            },
        )
        try:
            await anyio.to_thread.run_sync(daemon.wait_ready, 60.0)
            pool = await create_pool(pooled, min_size=1, max_size=2, statement_cache_size=0)
            try:
                sender = Sender(pool)
                start = time.monotonic()
                for i in range(latency.WARMUP + latency.JOBS):
                    delay = start + i / latency.RATE - time.monotonic()
                    if delay > 0:
                        await anyio.sleep(delay)
                    await sender.send(LATENCY_QUEUE, {"t": time.time()})
                await collector.arrivals(latency.WARMUP + latency.JOBS, 10.0 + poll)
            finally:
                await pool.close()
        finally:
            daemon.stop()
    return collector.figures(latency.WARMUP, latency.JOBS, "pooled")


async def idle_commits(server: PgBouncer | None) -> int:
    """Commits in the database of an idle worker over 30 s: direct in notify mode (``server``
    None) or through the pooler in poll mode; both at the default poll interval."""
    async with scratch_database("pool_idle") as url:
        await install_queues(url, IDLE)
        name = url.rsplit("/", 1)[1]
        if server is None:
            daemon = start_worker(url, "benchmarks.noop:IDLE")
        else:
            daemon = start_worker(through(server, url), "benchmarks.noop:IDLE", pooled_env(url))
        try:
            await anyio.to_thread.run_sync(daemon.wait_ready, 60.0)
            await anyio.sleep(IDLE_SETTLE)
            admin = await asyncpg.connect(url.rsplit("/", 1)[0] + "/postgres")
            try:
                query = "SELECT xact_commit FROM pg_stat_database WHERE datname = $1"
                await admin.execute("SELECT pg_stat_clear_snapshot()")
                before = await admin.fetchval(query, name)
                await anyio.sleep(IDLE_WINDOW)
                await admin.execute("SELECT pg_stat_clear_snapshot()")
                after = await admin.fetchval(query, name)
            finally:
                await admin.close()
        finally:
            daemon.stop()
    return int(after - before)


def _ratio(pooled: list[float], direct: list[float]) -> list[float]:
    return [p / d for p, d in zip(pooled, direct, strict=True) if d]


async def _each(measure: Callable[[], Awaitable[float]]) -> list[float]:
    return [await measure() for _ in range(RUNS)]


async def main() -> list[Row]:
    """Every pooler figure and its direct counterpart, then the ratios."""
    rows: list[Row] = []
    with bouncer() as server:
        print(f"  {server.version()}, pool_mode=transaction, {server.pool_size} server conns")
        drains_direct, drains_pooled = [], []
        sends: dict[str, list[float]] = {"d50": [], "d99": [], "p50": [], "p99": []}
        for _ in range(RUNS):
            drains_direct.append((await drain.drain_once()).rate)
            drains_pooled.append(await drain_through(server))
            print(f"  drain direct {drains_direct[-1]:,.0f}, pooled {drains_pooled[-1]:,.0f}")
            d50, d99 = await enqueue.single_send_latency()
            p50, p99 = await send_through(server)
            for key, value in (("d50", d50), ("d99", d99), ("p50", p50), ("p99", p99)):
                sends[key].append(value)
            print(f"  send direct p50 {d50:.3f} p99 {d99:.3f}, pooled {p50:.3f} {p99:.3f} ms")
        rows += [
            measured("pooler: drain 60,000, direct", drains_direct, "jobs/s", "-", None),
            measured("pooler: drain 60,000, through PgBouncer", drains_pooled, "jobs/s", "-", None),
            measured(
                "pooler: drain ratio pooled / direct",
                _ratio(drains_pooled, drains_direct),
                "x",
                "-",
                None,
                digits=2,
            ),
            measured("pooler: send p50, direct", sends["d50"], "ms", "-", None, digits=3),
            measured(
                "pooler: send p50, through PgBouncer", sends["p50"], "ms", "-", None, digits=3
            ),
            measured(
                "pooler: send p99, through PgBouncer", sends["p99"], "ms", "-", None, digits=3
            ),
            measured(
                "pooler: send p50 ratio pooled / direct",
                _ratio(sends["p50"], sends["d50"]),
                "x",
                "-",
                None,
                digits=2,
            ),
        ]
        direct50, direct99 = [], []
        for _ in range(RUNS):
            p50, p99 = await latency.pickup_latency()
            direct50.append(p50)
            direct99.append(p99)
        rows.append(
            measured("pooler: pickup p50, direct (NOTIFY)", direct50, "ms", "-", None, digits=1)
        )
        rows.append(
            measured("pooler: pickup p99, direct (NOTIFY)", direct99, "ms", "-", None, digits=1)
        )
        for poll in (0.5, 2.0):
            p50s, p99s = [], []
            for _ in range(RUNS):
                p50, p99 = await pickup_through(server, poll)
                p50s.append(p50)
                p99s.append(p99)
                print(f"  pickup poll {poll:g}s: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
            half = poll * 1000 / 2
            rows.append(
                measured(
                    f"pooler: pickup p50, poll mode {poll:g}s, through PgBouncer",
                    p50s,
                    "ms",
                    f"~{half:.0f} ms (half the interval)",
                    lambda v, half=half: 0.5 * half <= v <= 1.5 * half,
                    digits=1,
                )
            )
            rows.append(
                measured(
                    f"pooler: pickup p99, poll mode {poll:g}s, through PgBouncer",
                    p99s,
                    "ms",
                    f"<= {poll * 1000 + 100:.0f} ms",
                    lambda v, poll=poll: v <= poll * 1000 + 100,
                    digits=1,
                )
            )
        idle_direct = [float(await idle_commits(None)) for _ in range(RUNS)]
        idle_pooled = [float(await idle_commits(server)) for _ in range(RUNS)]
        print(f"  idle commits direct {idle_direct}, pooled {idle_pooled}")
        rows += [
            measured("pooler: idle commits / 30 s, direct (notify)", idle_direct, "", "-", None),
            measured(
                "pooler: idle commits / 30 s, through PgBouncer (poll)", idle_pooled, "", "-", None
            ),
        ]
    return rows


if __name__ == "__main__":  # pragma: no cover - run one module alone
    from worker.logging import configure_logging

    from .report import render

    configure_logging("warning", "console")
    result = anyio.run(main)
    print(render(result, [f"median of {RUNS} run(s) each"]))
