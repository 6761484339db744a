"""Fixtures of the usage tests: the hub, usage settings, installed usage queues, daemons."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.support.hub import Hub
from tests.support.processes import Daemon
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


@pytest.fixture
def hub() -> Iterator[Hub]:
    """A healthy hub on loopback, stopped after the test."""
    server = Hub().start()
    try:
        yield server
    finally:
        server.stop()


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
