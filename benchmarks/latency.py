"""Pickup latency: jobs sent at ~100 jobs/s from this process to a running worker."""

from __future__ import annotations

import asyncio
import time

import anyio

from api_sender import Sender

from .common import install_queues, percentile, scratch_database, start_worker
from .noop import LATENCY, LATENCY_QUEUE

RATE = 100.0
JOBS = 1_000
WARMUP = 50


class Collector(asyncio.DatagramProtocol):
    """Receives one latency (seconds, as text) per datagram from the worker's handler."""

    def __init__(self) -> None:
        self.samples: list[float] = []

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.samples.append(float(data))


async def pickup_latency() -> tuple[float, float]:
    """p50 and p99 (ms) from just before ``send`` to the handler's first line.

    The first ``WARMUP`` jobs (connections opening, statements being prepared) are not counted.
    """
    loop = asyncio.get_running_loop()
    transport, collector = await loop.create_datagram_endpoint(
        Collector, local_addr=("127.0.0.1", 0)
    )
    port = transport.get_extra_info("sockname")[1]
    try:
        async with scratch_database("latency") as url:
            await install_queues(url, LATENCY)
            daemon = start_worker(
                url, "benchmarks.noop:LATENCY", {"BENCH_LATENCY_ADDR": f"127.0.0.1:{port}"}
            )
            try:
                await anyio.to_thread.run_sync(daemon.wait_ready)
                async with Sender.connect(url, min_size=1, max_size=2) as sender:
                    start = time.monotonic()
                    for i in range(WARMUP + JOBS):
                        delay = start + i / RATE - time.monotonic()
                        if delay > 0:
                            await anyio.sleep(delay)
                        await sender.send(LATENCY_QUEUE, {"t": time.time()})
                    deadline = time.monotonic() + 10
                    while len(collector.samples) < WARMUP + JOBS and time.monotonic() < deadline:
                        await anyio.sleep(0.05)
            finally:
                daemon.stop()
    finally:
        transport.close()
    samples = collector.samples[WARMUP:]
    if len(samples) < JOBS * 0.99:
        raise RuntimeError(f"only {len(samples)} of {JOBS} latencies arrived")
    return percentile(samples, 50) * 1000, percentile(samples, 99) * 1000
