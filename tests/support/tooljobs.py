"""Tool job declarations the daemon under test loads through TOOL_JOBS.

Every run is written to ``public.ledger`` so a test can count executions (loss, duplicates).
The job's data steers the handler: ``{"sleep": s}`` runs s seconds, ``{"fail": true}`` raises,
``{"exit": true}`` kills the process mid-job (a poison job).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import asyncpg

from worker import JobDeclaration, JobInfo, Schedule

LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS public.ledger (
    seq     bigint GENERATED ALWAYS AS IDENTITY,
    job_id  bigint NOT NULL,
    queue   text NOT NULL,
    key     text,
    data    jsonb,
    attempt integer NOT NULL,
    pid     integer NOT NULL,
    phase   text NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)"""

_pool: asyncpg.Pool | None = None


async def _db() -> asyncpg.Pool:
    global _pool
    if _pool is None:
        _pool = await asyncpg.create_pool(os.environ["DATABASE_URL"], min_size=1, max_size=2)
    assert _pool is not None
    return _pool


async def _write(phase: str, data: Any, job: JobInfo) -> None:
    pool = await _db()
    await pool.execute(
        "INSERT INTO public.ledger (job_id, queue, key, data, attempt, pid, phase)"
        " VALUES ($1, $2, $3, $4::text::jsonb, $5, $6, $7)",
        job.id,
        job.queue,
        job.key,
        None if data is None else __import__("json").dumps(data),
        job.attempt,
        os.getpid(),
        phase,
    )


async def record(data: Any, job: JobInfo) -> None:
    """Write 'start', obey the data's instructions, write 'done'."""
    await _write("start", data, job)
    if isinstance(data, dict):
        if data.get("exit"):
            os._exit(3)
        if data.get("sleep"):
            await asyncio.sleep(float(data["sleep"]))
        if data.get("fail"):
            raise RuntimeError("asked to fail")
    await _write("done", data, job)


#: A work queue: batches of 10, 4 handlers at once.
WORK = [JobDeclaration(queue="tool-work", handler=record, batch_size=10, concurrency=4)]

#: A cron queue; the cron comes from TEST_TOOL_CRON (6 fields: seconds first).
CRON = [
    JobDeclaration(
        queue="tool-cron",
        handler=record,
        schedule=Schedule(
            cron=os.environ.get("TEST_TOOL_CRON", "*/2 * * * * *"),
            enabled=os.environ.get("TEST_TOOL_CRON_ENABLED", "1") == "1",
        ),
    )
]

#: A timer queue (no schedule).
TIMERS = [JobDeclaration(queue="tool-timer", handler=record)]
