"""The nightly retention purges on the chassis tables (contract section 7).

Each purge is a ``singleton`` queue and runs as an ordinary job: retries, dead letter and
metrics come with the queue. Two runs of one purge never overlap, whatever sent their jobs: each
run holds the purge's lock (see :mod:`.exclusive`).
"""

from __future__ import annotations

from ...declarations import QueueOptions
from ...queue.jobs import ClaimedJob
from ...queue.poller import Consumer
from ...settings import Settings
from ..spec import InstalledJob, JobContext
from .apikeys import retire_expired_api_keys
from .audit import audit_body
from .idempotency import purge_idempotency_keys
from .orphan_users import OrphanRule, orphan_body
from .runs import PurgeBody, run_purge

AUDIT_PURGE_QUEUE = "audit-purge"
APIKEY_EXPIRY_QUEUE = "apikey-expiry-sweep"
IDEMPOTENCY_PURGE_QUEUE = "idempotency-purge"
ORPHAN_USER_PURGE_QUEUE = "orphan-user-purge"

#: Singleton: one active job per key (the run lock covers jobs of different keys).
PURGE_OPTIONS = QueueOptions(
    policy="singleton", retry_limit=2, retry_delay=60, retry_backoff=True, expire_seconds=3600
)


def _purge(queue: str, cron: str | None, body: PurgeBody) -> InstalledJob:
    def make_consumer(ctx: JobContext) -> Consumer:
        async def run_job(job: ClaimedJob) -> object:
            await run_purge(
                ctx.pool,
                ctx.settings.jobs_schema,
                queue,
                job.id,
                body,
                session_url=ctx.session_url,
            )
            return None

        return Consumer(queue=queue, run_job=run_job, one_per_key=True)

    return InstalledJob(queue, PURGE_OPTIONS, cron, make_consumer)


def audit_purge(settings: Settings) -> InstalledJob:
    """audit-purge: scheduled only when AUDIT_RETENTION_DAYS > 0; a run at 0 deletes nothing."""
    days = settings.audit_retention_days
    return _purge(AUDIT_PURGE_QUEUE, settings.purge_cron if days else None, audit_body(days))


def apikey_expiry_sweep(settings: Settings) -> InstalledJob:
    """apikey-expiry-sweep: always scheduled."""
    return _purge(APIKEY_EXPIRY_QUEUE, settings.purge_cron, retire_expired_api_keys)


def idempotency_purge(settings: Settings) -> InstalledJob:
    """idempotency-purge: always scheduled."""
    return _purge(IDEMPOTENCY_PURGE_QUEUE, settings.purge_cron, purge_idempotency_keys)


def orphan_user_purge(settings: Settings) -> InstalledJob:
    """orphan-user-purge: scheduled only when ORPHAN_USER_RETENTION_HOURS > 0; 0 deletes nothing."""
    hours = settings.orphan_user_retention_hours
    rule = OrphanRule(retention_hours=hours, superadmins=settings.superadmins)
    return _purge(
        ORPHAN_USER_PURGE_QUEUE, settings.purge_cron if hours else None, orphan_body(rule)
    )
