"""The operator surfaces on a big table (issue 11): the admin API's job lists, the console's
overview and job pages, and the drain while someone watches the console.

Runs on the database :mod:`benchmarks.counts` filled with 5 million retained jobs, in the same
sitting: a real ``api`` process serves ``/v1/admin`` and ``/console``; each page is fetched
``FETCHES`` times over one keep-alive connection on loopback and the median wall time reported
(the request's whole server time plus a loopback round trip). Then the 60,000-job drain runs
``DRAIN_PAIRS`` times with the console's overview fetched every second and as often without,
interleaved, and the ratio of the medians is reported with the spread.
"""

from __future__ import annotations

import base64
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
import asyncpg
import httpx

from tests.support.processes import Daemon, start_daemon

from .report import Row, measured

T = TypeVar("T")

TOKEN = "bench-admin-token"
FETCHES = 20
DRAIN_PAIRS = 5


def basic_auth() -> dict[str, str]:
    """The console's HTTP Basic header with the admin token as the password."""
    return {"Authorization": "Basic " + base64.b64encode(f"bench:{TOKEN}".encode()).decode()}


def start_api(url: str, log_dir: str) -> Daemon:
    """An api process serving the admin surfaces, with the daemon's default timings."""
    from pathlib import Path

    return start_daemon(
        url,
        Path(log_dir),
        role="api",
        env={"ADMIN_TOKEN": TOKEN, "LOG_LEVEL": "warning"},
        name="bench-api",
        fast=False,
    )


def below(limit: float) -> Callable[[float], bool]:
    """A row check: the median is under ``limit``."""
    return lambda value: value < limit


def timed_gets(client: httpx.Client, path: str, auth: dict[str, str]) -> list[float]:
    """Seconds of ``FETCHES`` GETs of ``path`` (after one warm-up), each answered 200."""
    client.get(path, headers=auth).raise_for_status()
    seconds = []
    for _ in range(FETCHES):
        started = time.perf_counter()
        response = client.get(path, headers=auth)
        seconds.append(time.perf_counter() - started)
        response.raise_for_status()
    return seconds


async def page_figures(daemon: Daemon, url: str, queue: str, size: str) -> list[Row]:
    """Median times of the job list, a filtered list, the overview and a job page."""
    conn = await asyncpg.connect(url)
    try:
        job_id = await conn.fetchval(
            "SELECT max(id) FROM jobs.job WHERE queue = $1 AND state = 'failed'", queue
        )
    finally:
        await conn.close()
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    basic = basic_auth()
    pages = [
        ("admin API job list, newest 50", "/v1/admin/jobs?limit=50", bearer, 0.050),
        (
            f"admin API filtered list (queue {queue}, state failed), 50",
            f"/v1/admin/jobs?queue={queue}&state=failed&limit=50",
            bearer,
            0.050,
        ),
        (
            "console job list page, filtered",
            f"/console/jobs?queue={queue}&state=failed",
            basic,
            0.050,
        ),
        ("console overview page (counts, chart)", "/console/", basic, 0.200),
        (f"console job page (job {job_id})", f"/console/jobs/{job_id}", basic, 0.020),
    ]
    rows = []
    with httpx.Client(base_url=daemon.url(""), timeout=30) as client:
        for name, path, auth, target in pages:
            ms = sorted(
                1000 * s for s in await anyio.to_thread.run_sync(timed_gets, client, path, auth)
            )
            rows.append(
                measured(
                    f"{name}, {size} (median of {FETCHES})",
                    [statistics.median(ms)],
                    "ms",
                    f"< {target * 1000:.0f} ms",
                    below(target * 1000),
                    digits=1,
                    peer=f"p95 {ms[int(len(ms) * 0.95) - 1]:.1f} ms, max {ms[-1]:.1f} ms",
                )
            )
    return rows


async def watched(daemon: Daemon, work: Callable[[], Awaitable[T]]) -> tuple[T, int]:
    """Run ``work`` while the console's overview is fetched every second; (result, fetches)."""
    fetched = 0
    basic = basic_auth()
    result: list[T] = []

    async def watch() -> None:
        nonlocal fetched
        async with httpx.AsyncClient(base_url=daemon.url(""), timeout=30) as client:
            while True:
                started = time.monotonic()
                (await client.get("/console/", headers=basic)).raise_for_status()
                fetched += 1
                await anyio.sleep(max(0.0, 1.0 - (time.monotonic() - started)))

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        result.append(await work())
        tg.cancel_scope.cancel()
    return result[0], fetched


async def console_figures(
    url: str, queue: str, drain: Callable[[], Awaitable[float]], log_dir: str, size: str
) -> list[Row]:
    """Every console figure on the filled database ``url``; ``drain`` runs one drain there."""
    daemon = start_api(url, log_dir)
    try:
        await anyio.to_thread.run_sync(daemon.wait_ready, 120.0)
        rows = await page_figures(daemon, url, queue, size)
        with_console, without, fetches = [], [], 0
        for pair in range(DRAIN_PAIRS):
            if pair % 2 == 0:
                rate, n = await watched(daemon, drain)
                with_console.append(rate)
                without.append(await drain())
            else:
                without.append(await drain())
                rate, n = await watched(daemon, drain)
                with_console.append(rate)
            fetches += n
    finally:
        daemon.stop()
    ratio = statistics.median(with_console) / statistics.median(without)
    spread = (
        f"with {min(with_console):,.0f}-{max(with_console):,.0f},"
        f" without {min(without):,.0f}-{max(without):,.0f}"
    )
    return [
        *rows,
        measured(
            f"drain 60,000 jobs while /console/ is fetched every second ({fetches} fetches)",
            with_console,
            "jobs/s",
            "-",
            None,
        ),
        measured("drain 60,000 jobs, nobody watching, same sitting", without, "jobs/s", "-", None),
        Row(
            "drain with the console watched / without (medians of 5 interleaved)",
            ">= 0.9",
            f"{ratio:.2f}",
            ratio >= 0.9,
            spread,
        ),
    ]
