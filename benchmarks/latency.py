"""Pickup latency: jobs sent at ~100 jobs/s from this process to a running worker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

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
        self.port = 0

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.samples.append(float(data))

    async def arrivals(self, count: int, timeout: float) -> None:
        """Wait until ``count`` latencies arrived or ``timeout`` seconds passed."""
        deadline = time.monotonic() + timeout
        while len(self.samples) < count and time.monotonic() < deadline:
            await anyio.sleep(0.05)

    def figures(self, warmup: int, jobs: int, who: str) -> tuple[float, float]:
        """p50 and p99 (ms) after the first ``warmup``; at least 99% of ``jobs`` must be in."""
        samples = self.samples[warmup:]
        if len(samples) < jobs * 0.99:
            raise RuntimeError(f"only {len(samples)} of {jobs} {who} latencies arrived")
        return percentile(samples, 50) * 1000, percentile(samples, 99) * 1000


@asynccontextmanager
async def collecting() -> AsyncIterator[Collector]:
    """A :class:`Collector` listening on a free UDP port of 127.0.0.1 (its ``port``)."""
    loop = asyncio.get_running_loop()
    transport, collector = await loop.create_datagram_endpoint(
        Collector, local_addr=("127.0.0.1", 0)
    )
    collector.port = transport.get_extra_info("sockname")[1]
    try:
        yield collector
    finally:
        transport.close()


async def pickup_latency() -> tuple[float, float]:
    """p50 and p99 (ms) from just before ``send`` to the handler's first line.

    The first ``WARMUP`` jobs (connections opening, statements being prepared) are not counted.
    """
    async with collecting() as collector, scratch_database("latency") as url:
        await install_queues(url, LATENCY)
        daemon = start_worker(
            url, "benchmarks.noop:LATENCY", {"BENCH_LATENCY_ADDR": f"127.0.0.1:{collector.port}"}
        )
        try:
            await anyio.to_thread.run_sync(daemon.wait_ready, 60.0)
            async with Sender.connect(url, min_size=1, max_size=2) as sender:
                start = time.monotonic()
                for i in range(WARMUP + JOBS):
                    delay = start + i / RATE - time.monotonic()
                    if delay > 0:
                        await anyio.sleep(delay)
                    await sender.send(LATENCY_QUEUE, {"t": time.time()})
                await collector.arrivals(WARMUP + JOBS, 10.0)
        finally:
            daemon.stop()
    return collector.figures(WARMUP, JOBS, "our")
