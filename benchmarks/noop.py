"""The tool-job declarations the benchmark workers load through ``TOOL_JOBS``.

``benchmarks.noop:DRAIN`` (no-op handler), ``benchmarks.noop:LATENCY`` (reports pickup latency
over UDP) and ``benchmarks.noop:IDLE`` (one tool queue for the idle figure).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from worker import JobDeclaration, JobInfo

DRAIN_QUEUE = "bench-drain"
LATENCY_QUEUE = "bench-latency"
IDLE_QUEUE = "bench-idle"

#: The drain's claim size and handler count (BENCH_DRAIN_BATCH / BENCH_DRAIN_CONCURRENCY override).
DRAIN_BATCH = int(os.environ.get("BENCH_DRAIN_BATCH", "200"))
DRAIN_CONCURRENCY = int(os.environ.get("BENCH_DRAIN_CONCURRENCY", "400"))
#: The wide drain: batches of graphile-worker's batched local queue (localQueue.size 500), two
#: of them in hand (two claims in flight need concurrency >= 2 x batch; 1,000 is the maximum).
WIDE_BATCH = 500
WIDE_CONCURRENCY = 1000


async def noop(_data: Any, _info: JobInfo) -> None:
    """Do nothing: the drain measures the queue, not the handler."""


_latency_socket: socket.socket | None = None


async def report_latency(data: Any, _info: JobInfo) -> None:
    """Send ``now - data["t"]`` (seconds since the sender called ``send``) to the benchmark."""
    now = time.time()
    global _latency_socket
    if _latency_socket is None:
        _latency_socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    host, _, port = os.environ["BENCH_LATENCY_ADDR"].partition(":")
    _latency_socket.sendto(repr(now - data["t"]).encode(), (host, int(port)))


DRAIN = [
    JobDeclaration(
        queue=DRAIN_QUEUE, handler=noop, batch_size=DRAIN_BATCH, concurrency=DRAIN_CONCURRENCY
    )
]
LATENCY = [
    JobDeclaration(queue=LATENCY_QUEUE, handler=report_latency, batch_size=10, concurrency=10)
]
IDLE = [JobDeclaration(queue=IDLE_QUEUE, handler=noop)]
