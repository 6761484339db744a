"""The nightly retention purges on the chassis tables (contract section 7)."""

from __future__ import annotations

from ...declarations import QueueOptions
from ...queue.jobs import ClaimedJob
from ...queue.poller import Consumer
from ...settings import Settings
from ..spec import InstalledJob, JobContext

AUDIT_PURGE_QUEUE = "audit-purge"
APIKEY_EXPIRY_QUEUE = "apikey-expiry-sweep"
IDEMPOTENCY_PURGE_QUEUE = "idempotency-purge"
ORPHAN_USER_PURGE_QUEUE = "orphan-user-purge"

#: Singleton: two replicas never sweep the same table at once.
PURGE_OPTIONS = QueueOptions(
    policy="singleton", retry_limit=2, retry_delay=60, retry_backoff=True, expire_seconds=3600
)


def _purge(queue: str, cron: str | None) -> InstalledJob:
    def make_consumer(ctx: JobContext) -> Consumer:
        async def run_job(job: ClaimedJob) -> object:
            raise NotImplementedError(f"{queue} is not implemented yet")

        return Consumer(queue=queue, run_job=run_job, one_per_key=True)

    return InstalledJob(queue, PURGE_OPTIONS, cron, make_consumer)


def audit_purge(settings: Settings) -> InstalledJob:
    """audit-purge: scheduled only when AUDIT_RETENTION_DAYS > 0."""
    return _purge(AUDIT_PURGE_QUEUE, settings.purge_cron if settings.audit_retention_days else None)


def apikey_expiry_sweep(settings: Settings) -> InstalledJob:
    """apikey-expiry-sweep: always scheduled."""
    return _purge(APIKEY_EXPIRY_QUEUE, settings.purge_cron)


def idempotency_purge(settings: Settings) -> InstalledJob:
    """idempotency-purge: always scheduled."""
    return _purge(IDEMPOTENCY_PURGE_QUEUE, settings.purge_cron)


def orphan_user_purge(settings: Settings) -> InstalledJob:
    """orphan-user-purge: scheduled only when ORPHAN_USER_RETENTION_HOURS > 0."""
    return _purge(
        ORPHAN_USER_PURGE_QUEUE,
        settings.purge_cron if settings.orphan_user_retention_hours else None,
    )
