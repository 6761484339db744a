"""Producer figures: ``send_many`` throughput and single ``send`` latency, through ``Sender``,
through ``SyncSender`` (psycopg 3) and through the SQL functions (``SELECT jobs.send(...)``) over
a bare asyncpg connection."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

import asyncpg

from api_sender import Sender, SyncSender

from .common import install_queues, percentile, scratch_database
from .noop import DRAIN, DRAIN_QUEUE

SEND_MANY_JOBS = 20_000
SEND_MANY_CHUNK = 1_000
SINGLE_SENDS = 5_000
SINGLE_WARMUP = 200


def _p50_p99_ms(samples: list[float]) -> tuple[float, float]:
    return percentile(samples, 50) * 1000, percentile(samples, 99) * 1000


async def time_in_sequence(call: Callable[[int], Awaitable[object]]) -> tuple[float, float]:
    """p50 and p99 (ms) of ``SINGLE_SENDS`` calls of ``call(n)`` awaited one after another,
    after ``SINGLE_WARMUP`` untimed ones: how every single-send figure here is timed."""
    for i in range(SINGLE_WARMUP):
        await call(i)
    samples = []
    for i in range(SINGLE_SENDS):
        started = time.perf_counter()
        await call(i)
        samples.append(time.perf_counter() - started)
    return _p50_p99_ms(samples)


def time_in_sequence_sync(call: Callable[[int], object]) -> tuple[float, float]:
    """:func:`time_in_sequence` for a blocking ``call``."""
    for i in range(SINGLE_WARMUP):
        call(i)
    samples = []
    for i in range(SINGLE_SENDS):
        started = time.perf_counter()
        call(i)
        samples.append(time.perf_counter() - started)
    return _p50_p99_ms(samples)


async def send_many_rate() -> tuple[float, float]:
    """Jobs/s of 20,000 jobs in one ``send_many``, then in 20 sequential calls of 1,000.

    Each on its own fresh database, after a 10-job warm-up call (statement prepared, pool
    connection open), so the figure is the steady-state cost of the call.
    """
    payloads = [{"n": i, "kind": "bench"} for i in range(SEND_MANY_JOBS)]
    rates = []
    for chunk in (SEND_MANY_JOBS, SEND_MANY_CHUNK):
        async with scratch_database("send_many") as url:
            await install_queues(url, DRAIN)
            async with Sender.connect(url, min_size=1, max_size=1) as sender:
                await sender.send_many(DRAIN_QUEUE, payloads[:10])
                started = time.perf_counter()
                for i in range(0, SEND_MANY_JOBS, chunk):
                    ids = await sender.send_many(DRAIN_QUEUE, payloads[i : i + chunk])
                    assert len(ids) == min(chunk, SEND_MANY_JOBS - i)
                elapsed = time.perf_counter() - started
        rates.append(SEND_MANY_JOBS / elapsed)
    return rates[0], rates[1]


async def single_send_latency() -> tuple[float, float]:
    """p50 and p99 (ms) of 5,000 ``send`` calls awaited one after another, after a warm-up."""
    async with scratch_database("send") as url:
        await install_queues(url, DRAIN)
        async with Sender.connect(url, min_size=1, max_size=1) as sender:
            return await time_in_sequence(lambda n: sender.send(DRAIN_QUEUE, {"n": n}))


async def commit_floor() -> tuple[float, float]:
    """p50 and p99 (ms) of the cheapest durable write: a one-row INSERT into a bare table
    (identity key, jsonb) on a direct connection, timed as :func:`single_send_latency`.

    No send can beat one synchronous commit on this server's disk; this is that floor, so a
    send figure can be read against the machine it ran on.
    """
    async with scratch_database("floor") as url:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(
                "CREATE TABLE floor"
                " (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, data jsonb)"
            )
            insert = "INSERT INTO floor (data) VALUES ($1::text::jsonb)"
            return await time_in_sequence(lambda n: conn.execute(insert, f'{{"n": {n}}}'))
        finally:
            await conn.close()


#: The job row a send writes, written directly: the queue's settings are read once first.
_JOB_INSERT = """
INSERT INTO jobs.job (queue, policy, data, priority, start_after,
                      retry_limit, retry_delay, retry_backoff, expire_seconds)
VALUES ($1, $2, $3::text::jsonb, 0, now(), $4, $5, $6, $7)
"""


async def job_table_floor() -> tuple[float, float]:
    """p50 and p99 (ms) of a one-row INSERT straight into ``jobs.job`` (the row a send writes,
    no function, no NOTIFY), timed as :func:`commit_floor`: what the job table itself costs over
    the bare floor (its wider row, the ``job_fetch`` index, the counter trigger's test), so a
    send's ratio to the floor can be split into the table's share and the send's own."""
    async with scratch_database("job_floor") as url:
        await install_queues(url, DRAIN)
        conn = await asyncpg.connect(url)
        try:
            q = await conn.fetchrow(
                "SELECT policy, retry_limit, retry_delay, retry_backoff, expire_seconds"
                " FROM jobs.queue WHERE name = $1",
                DRAIN_QUEUE,
            )
            assert q is not None
            policy, *settings = q.values()
            return await time_in_sequence(
                lambda n: conn.execute(_JOB_INSERT, DRAIN_QUEUE, policy, f'{{"n": {n}}}', *settings)
            )
        finally:
            await conn.close()


async def sql_send_latency() -> tuple[float, float]:
    """p50 and p99 (ms) of 5,000 ``SELECT jobs.send(queue, data)`` on one asyncpg connection,
    timed as :func:`single_send_latency`: the SQL function any client calls (contract 11)."""
    async with scratch_database("sql_send") as url:
        await install_queues(url, DRAIN)
        conn = await asyncpg.connect(url)
        try:
            send = "SELECT jobs.send($1, $2::text::jsonb)"
            return await time_in_sequence(
                lambda n: conn.fetchval(send, DRAIN_QUEUE, f'{{"n": {n}}}')
            )
        finally:
            await conn.close()


async def sql_send_many_rate() -> tuple[float, float]:
    """Jobs/s of 20,000 jobs in one ``SELECT jobs.send_many(queue, data[])``, then in 20 calls
    of 1,000, each on a fresh database after a 10-job warm-up, as :func:`send_many_rate`."""
    payloads = [json.dumps({"n": i, "kind": "bench"}) for i in range(SEND_MANY_JOBS)]
    send_many = "SELECT jobs.send_many($1, $2::text[]::jsonb[])"
    rates = []
    for chunk in (SEND_MANY_JOBS, SEND_MANY_CHUNK):
        async with scratch_database("sql_send_many") as url:
            await install_queues(url, DRAIN)
            conn = await asyncpg.connect(url)
            try:
                await conn.fetchval(send_many, DRAIN_QUEUE, payloads[:10])
                started = time.perf_counter()
                for i in range(0, SEND_MANY_JOBS, chunk):
                    ids = await conn.fetchval(send_many, DRAIN_QUEUE, payloads[i : i + chunk])
                    assert len(ids) == min(chunk, SEND_MANY_JOBS - i)
                elapsed = time.perf_counter() - started
            finally:
                await conn.close()
        rates.append(SEND_MANY_JOBS / elapsed)
    return rates[0], rates[1]


def _sync_send_latency(url: str) -> tuple[float, float]:
    with SyncSender.connect(url) as sender:
        return time_in_sequence_sync(lambda n: sender.send(DRAIN_QUEUE, {"n": n}))


async def sync_send_latency() -> tuple[float, float]:
    """p50 and p99 (ms) of 5,000 ``SyncSender.send`` calls (psycopg 3, its own autocommit
    connection) one after another, in a thread, timed as :func:`single_send_latency`."""
    async with scratch_database("sync_send") as url:
        await install_queues(url, DRAIN)
        return await asyncio.to_thread(_sync_send_latency, url)


def _sync_send_many(url: str) -> float:
    payloads = [{"n": i, "kind": "bench"} for i in range(SEND_MANY_JOBS)]
    with SyncSender.connect(url) as sender:
        sender.send_many(DRAIN_QUEUE, payloads[:10])
        started = time.perf_counter()
        ids = sender.send_many(DRAIN_QUEUE, payloads)
        elapsed = time.perf_counter() - started
    assert len(ids) == SEND_MANY_JOBS
    return SEND_MANY_JOBS / elapsed


async def sync_send_many_rate() -> float:
    """Jobs/s of 20,000 jobs in one ``SyncSender.send_many``, after a 10-job warm-up, on a fresh
    database, as :func:`send_many_rate`."""
    async with scratch_database("sync_send_many") as url:
        await install_queues(url, DRAIN)
        return await asyncio.to_thread(_sync_send_many, url)
