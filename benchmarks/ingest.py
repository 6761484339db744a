"""Usage throughput: ingest over HTTP, ``usage.emit``, and end-to-end delivery to a hub.

Each run uses one fresh scratch database:

* ``ingest``: 20,000 events POSTed to ``/v1/usage-events`` of a real ``api`` process in batches
  of 100, 4 requests in flight (httpx); events/s from the first request to the last 202.
* ``emit``: 5,000 ``sender.usage.emit`` calls from this process, awaited one after another
  (one connection), then 5,000 more from 16 concurrent tasks over a pool of 4.
* ``delivery``: the 30,000 events those left on the usage queue, drained by one real ``worker``
  process (``USAGE_DOWNSTREAM=http``, batches of ``USAGE_BATCH_SIZE`` = 50) into a loopback hub
  that answers at once; events/s from the hub's first accepted event to its last.

The hub runs in this process on the same cores as PostgreSQL and the worker, so the delivery
figure is a floor, not the worker's ceiling.
"""

from __future__ import annotations

import asyncio
import sys
import time

import anyio
import httpx

from api_sender import Sender, UsageEvent, create_pool
from tests.support.hub import Hub
from tests.support.processes import Daemon
from worker.install import install
from worker.jobs.registry import installed_jobs
from worker.logging import configure_logging
from worker.settings import Settings

from .common import RUNS, SCHEMA, scratch_database, start_worker
from .report import Row, measured

TOKEN = "bench-token"
INGEST_EVENTS = 20_000
INGEST_BATCH = 100
INGEST_IN_FLIGHT = 4
EMIT_EVENTS = 5_000
EMIT_TASKS = 16


def _body(n: int) -> dict[str, object]:
    return {
        "events": [
            {
                "meter": "api.calls",
                "quantity": i,
                "workspace_id": f"w{i % 13}",
                "occurred_at": "2026-01-01T00:00:00Z",
            }
            for i in range(n)
        ]
    }


async def ingest_rate(daemon: Daemon) -> float:
    """Events/s through POST /v1/usage-events, batches of 100, 4 requests in flight."""
    url = f"http://127.0.0.1:{daemon.port}/v1/usage-events"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    requests = INGEST_EVENTS // INGEST_BATCH
    body = _body(INGEST_BATCH)
    limits = httpx.Limits(max_connections=INGEST_IN_FLIGHT)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        await client.post(url, json=_body(1), headers=headers)  # warm-up: connection, statement
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(requests):
            queue.put_nowait(i)

        async def post_all() -> None:
            while not queue.empty():
                queue.get_nowait()
                response = await client.post(url, json=body, headers=headers)
                if response.status_code != 202:
                    raise RuntimeError(f"ingest answered {response.status_code}: {response.text}")

        started = time.perf_counter()
        await asyncio.gather(*(post_all() for _ in range(INGEST_IN_FLIGHT)))
        return INGEST_EVENTS / (time.perf_counter() - started)


async def emit_rates(url: str) -> tuple[float, float]:
    """Events/s of usage.emit: sequential on one connection, then 16 tasks over 4."""
    pool = await create_pool(url, min_size=4, max_size=4)
    try:
        sender = Sender(pool)
        await sender.usage.emit(UsageEvent("warm", 1, "w"))
        started = time.perf_counter()
        for i in range(EMIT_EVENTS):
            if await sender.usage.emit(UsageEvent("api.calls", i, "w")) is None:
                raise RuntimeError("emit failed")
        sequential = EMIT_EVENTS / (time.perf_counter() - started)

        async def emit_share(count: int) -> None:
            for i in range(count):
                if await sender.usage.emit(UsageEvent("api.calls", i, "w")) is None:
                    raise RuntimeError("emit failed")

        started = time.perf_counter()
        await asyncio.gather(*(emit_share(EMIT_EVENTS // EMIT_TASKS) for _ in range(EMIT_TASKS)))
        concurrent = (EMIT_EVENTS // EMIT_TASKS * EMIT_TASKS) / (time.perf_counter() - started)
        return sequential, concurrent
    finally:
        await pool.close()


async def delivery_rate(url: str, hub: Hub, expected: int) -> float:
    """Events/s a worker delivers to a hub that answers at once (hub's first to last accept)."""
    daemon = start_worker(url, "", env={**hub.env(), "LOG_LEVEL": "warning"})
    try:
        deadline = time.monotonic() + 300
        while len(hub.accepted_ids()) < expected:
            if time.monotonic() > deadline or daemon.process.poll() is not None:
                raise RuntimeError(f"delivery stalled:\n{daemon.logs()[-2000:]}")
            await asyncio.sleep(0.1)
    finally:
        daemon.stop()
    times = [r.at for r in hub.snapshot().accepted.values()]
    return expected / max(max(times) - min(times), 1e-9)


async def one_run() -> tuple[float, float, float, float]:
    """Ingest, emit and delivery figures on one scratch database."""
    async with scratch_database("ingest") as url:
        settings = Settings(_env_file=None)  # type: ignore[call-arg]
        await install(url, SCHEMA, installed_jobs(settings, []), cron_tz="UTC", lock_timeout=60)
        api = start_worker(url, "", env={"SERVICE_ROLE": "api", "INGEST_TOKEN": TOKEN})
        try:
            await anyio.to_thread.run_sync(api.wait_ready, 60.0)
            ingest = await ingest_rate(api)
        finally:
            api.stop()
        sequential, concurrent = await emit_rates(url)
        hub = Hub().start()
        try:
            expected = 1 + INGEST_EVENTS + 1 + EMIT_EVENTS + EMIT_EVENTS // EMIT_TASKS * EMIT_TASKS
            delivery = await delivery_rate(url, hub, expected)
        finally:
            hub.stop()
        return ingest, sequential, concurrent, delivery


def main() -> list[Row]:
    """Measure every usage figure ``RUNS`` times; print and return the summary rows."""
    runs = []
    for run in range(RUNS):
        figures = anyio.run(one_run, backend_options={"use_uvloop": True})
        runs.append(figures)
        ingest, sequential, concurrent, delivery = figures
        print(
            f"  run {run + 1}: ingest {ingest:,.0f} ev/s, emit {sequential:,.0f} ev/s "
            f"(x{EMIT_TASKS}: {concurrent:,.0f}), delivery {delivery:,.0f} ev/s",
            flush=True,
        )
    columns = list(zip(*runs, strict=True))
    rows = [
        measured("usage ingest, POST batches of 100 (4 in flight)", columns[0], "ev/s", "-", None),
        measured("usage.emit, sequential", columns[1], "ev/s", "-", None),
        measured(
            f"usage.emit, {EMIT_TASKS} tasks over 4 connections", columns[2], "ev/s", "-", None
        ),
        measured("usage delivery to a loopback hub (batches of 50)", columns[3], "ev/s", "-", None),
    ]
    for row in rows:
        print(f"  {row.figure}: {row.value} {row.runs}")
    return rows


if __name__ == "__main__":
    configure_logging("warning", "console")
    main()
    sys.exit(0)
