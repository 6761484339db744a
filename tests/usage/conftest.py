"""Fixtures of the usage tests: the hub, usage settings, installed usage queues, daemons."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.processes import Daemon, start_daemon
from worker.install import install_queues
from worker.jobs.usage import usage_jobs
from worker.queue.jobs import ClaimedJob
from worker.queue.sql import render
from worker.queue.store import JobStore
from worker.settings import Settings

#: The bearer token of the daemons under test.
TOKEN = "test-ingest-token"

#: Shrunk usage timings: one retry, no delay, a one-second hold, a two-second hub timeout.
FAST_USAGE = {
    "INGEST_TOKEN": TOKEN,
    "USAGE_RETRY_LIMIT": "1",
    "USAGE_RETRY_DELAY_SECONDS": "0",
    "USAGE_HELD_DELAY_SECONDS": "1",
    "HUB_TIMEOUT_SECONDS": "2",
    "POLL_INTERVAL_SECONDS": "0.5",
}


def usage_settings(db_url: str, **overrides: Any) -> Settings:
    """Settings for in-process usage components (no .env, shrunk timings)."""
    values: dict[str, Any] = {
        "database_url": db_url,
        "usage_retry_limit": 1,
        "usage_retry_delay_seconds": 0,
        "usage_held_delay_seconds": 1,
        "hub_timeout_seconds": 2.0,
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


async def install_usage(pool: asyncpg.Pool, settings: Settings) -> None:
    """Install the usage and held queues as a worker install does."""
    async with pool.acquire() as conn:
        await install_queues(conn, render("jobs"), "jobs", usage_jobs(settings), cron_tz="UTC")


async def claim(pool: asyncpg.Pool, queue: str, limit: int = 1000) -> list[ClaimedJob]:
    """Claim due jobs of ``queue`` as a fresh worker would."""
    return await JobStore(pool, render("jobs"), uuid.uuid4()).claim(queue, limit)


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[list[Daemon]]:
    """Daemons a test starts (append them); each is stopped, or killed, afterwards."""
    started: list[Daemon] = []
    yield started
    for daemon in started:
        if daemon.process.poll() is None:
            daemon.stop(timeout=15)


def fetch(url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    """Run one query on ``url`` from synchronous test code."""

    async def run() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(url)
        try:
            rows: list[asyncpg.Record] = await conn.fetch(query, *args)
            return rows
        finally:
            await conn.close()

    return asyncio.run(run())


def ingest(
    daemon: Daemon, body: Any, *, token: str | None = TOKEN, path: str = "/v1/usage-events"
) -> httpx.Response:
    """POST ``body`` as JSON to the daemon with the bearer token (``None``: no header)."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return httpx.post(daemon.url(path), json=body, headers=headers, timeout=15)


def start(
    daemons: list[Daemon], url: str, log_dir: Path, *, role: str = "all", **env: str
) -> Daemon:
    """Start a daemon with the fast usage settings (plus ``env``) and wait until ready."""
    daemon = start_daemon(url, log_dir, role=role, env={**FAST_USAGE, **env}, name=role)
    daemons.append(daemon)
    daemon.wait_ready(60)
    return daemon


def metric(daemon: Daemon, name: str, **labels: str) -> float:
    """One sample of the daemon's /metrics (0 when absent)."""
    status, text = daemon.get("/metrics")
    assert status == 200
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def log_events(daemon: Daemon, name: str) -> list[dict[str, Any]]:
    """The daemon's JSON log lines with event ``name``."""
    return [e for e in daemon.events() if e.get("event") == name]
