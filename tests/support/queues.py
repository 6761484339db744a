"""Creating queues in a test database the way the install does."""

from __future__ import annotations

from typing import Any

import asyncpg

from worker.declarations import QueueOptions
from worker.install import install_queues
from worker.jobs.spec import InstalledJob
from worker.queue.poller import Consumer
from worker.queue.sql import render


def _no_consumer(_: object) -> Consumer:
    raise AssertionError("test queues have no consumer")


async def make_queue(
    pool: asyncpg.Pool,
    name: str,
    *,
    cron: str | None = None,
    schema: str = "jobs",
    **options: Any,
) -> None:
    """Create (or update) queue ``name`` with ``options`` (QueueOptions fields)."""
    job = InstalledJob(name, QueueOptions(**options), cron, _no_consumer)
    async with pool.acquire() as conn:
        await install_queues(conn, render(schema), schema, [job], cron_tz="UTC")
