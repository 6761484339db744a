"""A cancel whose NOTIFY arrives after the claim committed but before the handler started (its
claim's answer on its way, or the job waiting for a runner) still interrupts the handler: the
hint is kept for a few seconds and checked again when the run starts."""

from __future__ import annotations

from typing import Any

import anyio
import asyncpg
import pytest

from api_sender import Sender
from tests.support.queues import make_queue
from worker.boot import _serve_worker
from worker.declarations import JobDeclaration
from worker.jobs.registry import installed_jobs
from worker.queue.jobs import ClaimedJob
from worker.queue.store import JobStore
from worker.settings import Settings
from worker.signals import StopRequest
from worker.state import ServiceState

QUEUE = "early-cancel"


async def test_a_cancel_hinted_before_its_run_starts_still_interrupts_it(
    db_url: str, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job is cancelled (with its NOTIFY) right after its claim commits and the claim's
    answer is held back half a second, so the hint's check finds it not running; once the run
    starts it is checked again and interrupted at once (the old code let it run its 30 s)."""
    await make_queue(pool, QUEUE)
    sender = Sender(pool)
    [job_id] = await sender.send_many(QUEUE, [{"slow": True}])
    started = anyio.Event()
    interrupted = anyio.Event()
    real_claim = JobStore.claim

    async def claim(self: JobStore, queue: str, limit: int, **options: Any) -> list[ClaimedJob]:
        jobs = await real_claim(self, queue, limit, **options)
        if queue == QUEUE and any(job.id == job_id for job in jobs):
            assert await sender.jobs.cancel([job_id]) == [job_id]
            await anyio.sleep(0.5)  # the NOTIFY arrives and its check runs meanwhile
        return jobs

    monkeypatch.setattr(JobStore, "claim", claim)

    async def handler(_data: Any, _job: Any) -> None:
        started.set()
        try:
            await anyio.sleep(30)
        except anyio.get_cancelled_exc_class():
            interrupted.set()
            raise

    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        database_url=db_url,
        service_role="worker",
        poll_interval_seconds=0.5,
        database_pool_size=4,
    )
    state = ServiceState(settings)
    stop = StopRequest()
    jobs = installed_jobs(settings, [JobDeclaration(queue=QUEUE, handler=handler)])
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_serve_worker, settings, db_url, pool, sender, state, jobs, stop)
            await started.wait()
            with anyio.move_on_after(3):
                await interrupted.wait()
            stop.request("test")
    assert interrupted.is_set(), "the cancel hinted before the run started was lost"
    assert await pool.fetchval("SELECT state::text FROM jobs.job WHERE id = $1", job_id) == (
        "cancelled"
    )
