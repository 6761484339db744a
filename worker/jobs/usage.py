"""The usage pipeline's queues: usage-events (to the downstream) and usage-events-held."""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from api_sender import USAGE_HELD_QUEUE, USAGE_QUEUE, usage_send_options

from ..declarations import QueueOptions
from ..queue.jobs import ClaimedJob
from ..queue.poller import Consumer
from ..settings import Settings
from .spec import InstalledJob, JobContext

log = structlog.get_logger("worker.usage")

HELD_OPTIONS = QueueOptions(retry_limit=10, retry_delay=60, retry_backoff=True)


def usage_jobs(settings: Settings) -> list[InstalledJob]:
    """The held queue first, then the usage queue that names it as its dead letter."""
    usage_options = QueueOptions(
        retry_limit=settings.usage_retry_limit,
        retry_delay=settings.usage_retry_delay_seconds,
        retry_backoff=True,
        dead_letter=USAGE_HELD_QUEUE,
    )

    def make_usage(ctx: JobContext) -> Consumer:
        async def run_batch(jobs: list[ClaimedJob]) -> Mapping[int, str] | None:
            if settings.usage_downstream == "log":
                log.info("usage.delivered", count=len(jobs), ids=[j.data["id"] for j in jobs])
            return None

        return Consumer(
            queue=USAGE_QUEUE, batch_size=settings.usage_batch_size, run_batch=run_batch
        )

    def make_held(ctx: JobContext) -> Consumer:
        async def run_batch(jobs: list[ClaimedJob]) -> Mapping[int, str] | None:
            retry = settings.usage_retry
            for job in jobs:
                options = usage_send_options(
                    job.data["id"], retry, start_after=retry.held_delay_seconds
                )
                await ctx.sender.send_with(USAGE_QUEUE, job.data, options)
            return None

        return Consumer(queue=USAGE_HELD_QUEUE, batch_size=50, run_batch=run_batch)

    return [
        InstalledJob(USAGE_HELD_QUEUE, HELD_OPTIONS, None, make_held),
        InstalledJob(USAGE_QUEUE, usage_options, None, make_usage),
    ]
