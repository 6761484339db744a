"""The usage pipeline's queues: usage-events (to the downstream) and usage-events-held.

Nothing here ever drops an event: a batch the downstream does not take goes back to its retry,
a batch out of retries is copied to the held queue, and the held queue sends every event back
after ``USAGE_HELD_DELAY_SECONDS``, round after round, until it is delivered or an operator
discards it (``chassis-worker held discard``).
"""

from __future__ import annotations

from api_sender import USAGE_HELD_QUEUE, USAGE_QUEUE

from ...declarations import QueueOptions
from ...downstream import make_downstream
from ...queue.poller import Consumer
from ...settings import Settings
from ..spec import InstalledJob, JobContext
from .deliver import UsageDelivery
from .held import HeldRedrive

#: Batches of one process posted at once: a slow hub answer does not stop the next batch.
USAGE_CONCURRENCY = 2
#: Held events re-sent per statement.
HELD_BATCH_SIZE = 100

#: The held queue's own retries cover a re-send the database refuses. They never run out in
#: practice (a minute apart, a million of them) because the held queue has no dead letter: a
#: held job that failed for good would be an event dropped.
HELD_OPTIONS = QueueOptions(retry_limit=1_000_000, retry_delay=60, retry_backoff=False)


def usage_options(settings: Settings) -> QueueOptions:
    """The usage queue: the retry budget of the settings, the held queue as its dead letter."""
    return QueueOptions(
        retry_limit=settings.usage_retry_limit,
        retry_delay=settings.usage_retry_delay_seconds,
        retry_backoff=True,
        dead_letter=USAGE_HELD_QUEUE,
    )


def usage_jobs(settings: Settings) -> list[InstalledJob]:
    """The held queue first, then the usage queue that names it as its dead letter."""

    def make_usage(ctx: JobContext) -> Consumer:
        delivery = UsageDelivery(make_downstream(settings), ctx.sender)
        return Consumer(
            queue=USAGE_QUEUE,
            batch_size=settings.usage_batch_size,
            concurrency=USAGE_CONCURRENCY,
            run_batch=delivery.run_batch,
        )

    def make_held(ctx: JobContext) -> Consumer:
        redrive = HeldRedrive(ctx.sender, settings.usage_retry)
        return Consumer(
            queue=USAGE_HELD_QUEUE, batch_size=HELD_BATCH_SIZE, run_batch=redrive.run_batch
        )

    return [
        InstalledJob(USAGE_HELD_QUEUE, HELD_OPTIONS, None, make_held),
        InstalledJob(USAGE_QUEUE, usage_options(settings), None, make_usage),
    ]
