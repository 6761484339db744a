"""Running a purge for a test: as a job of its real queue, or directly with a chosen clock."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import asyncpg

from api_sender import Sender
from tests.support.postgres import server_url, with_database
from worker.db.bounded import HandlerPool
from worker.install import install_queues
from worker.jobs.purges.runs import PurgeBody, PurgeRun, run_purge
from worker.jobs.registry import installed_jobs
from worker.jobs.spec import JobContext
from worker.queue.sql import render
from worker.queue.store import JobStore
from worker.settings import Settings

SCHEMA = "jobs"


def make_settings(**values: Any) -> Settings:
    """Settings for a test, ignoring any ``.env`` file."""
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


async def session_url(pool: asyncpg.Pool) -> str:
    """The URL of ``pool``'s test database, for the purge run lock's dedicated connection."""
    return with_database(server_url(), await pool.fetchval("SELECT current_database()"))


async def install_purges(pool: asyncpg.Pool, settings: Settings) -> None:
    """Create every queue and schedule the worker installs for ``settings``."""
    async with pool.acquire() as conn:
        await install_queues(
            conn, render(SCHEMA), SCHEMA, installed_jobs(settings, []), cron_tz="UTC"
        )


async def run_purge_job(pool: asyncpg.Pool, settings: Settings, queue: str) -> int:
    """Install the queues, send one job to ``queue``, claim it and run it as a worker would."""
    await install_purges(pool, settings)
    job = next(j for j in installed_jobs(settings, []) if j.queue == queue)
    sender = Sender(pool)
    job_id = await sender.send(queue, {})
    assert job_id is not None
    store = JobStore(pool, render(SCHEMA), uuid.uuid4())
    claimed = await store.claim(queue, 1, one_per_key=True)
    assert [c.id for c in claimed] == [job_id]
    context = JobContext(
        settings=settings,
        pool=HandlerPool(pool, 2),
        sender=sender,
        session_url=await session_url(pool),
    )
    run_job = job.make_consumer(context).run_job
    assert run_job is not None
    await run_job(claimed[0])
    assert await store.complete(claimed) == {job_id}
    return job_id


async def run_body(
    pool: asyncpg.Pool, queue: str, body: PurgeBody, *, now: datetime | None = None
) -> PurgeRun:
    """Run ``body`` through the run wrapper, or alone against the instant ``now`` if given."""
    if now is None:
        return await run_purge(
            HandlerPool(pool, 2), SCHEMA, queue, None, body, session_url=await session_url(pool)
        )
    run = PurgeRun(queue=queue, now=now)
    async with pool.acquire() as conn:
        await body(conn, run)
    return run
