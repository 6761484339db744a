"""Schedules of the purges: retention 0 removes the schedule, never the queue."""

from __future__ import annotations

import asyncpg

from worker.install import install
from worker.jobs.purges import (
    APIKEY_EXPIRY_QUEUE,
    AUDIT_PURGE_QUEUE,
    IDEMPOTENCY_PURGE_QUEUE,
    ORPHAN_USER_PURGE_QUEUE,
)
from worker.jobs.registry import installed_jobs
from worker.settings import Settings

from .chassis import DAY, add_audit_rows, add_user, user_ids
from .runner import make_settings, run_purge_job

PURGES = {AUDIT_PURGE_QUEUE, APIKEY_EXPIRY_QUEUE, IDEMPOTENCY_PURGE_QUEUE, ORPHAN_USER_PURGE_QUEUE}


async def _install(db_url: str, settings: Settings) -> None:
    await install(db_url, "jobs", installed_jobs(settings, []), cron_tz="UTC", lock_timeout=30)


async def _schedules(pool: asyncpg.Pool) -> dict[str, str]:
    rows = await pool.fetch("SELECT queue, cron FROM jobs.schedule")
    return {r["queue"]: r["cron"] for r in rows if r["queue"] in PURGES}


async def test_every_purge_is_a_singleton_queue_on_the_purge_cron(
    db_url: str, pool: asyncpg.Pool
) -> None:
    """With both retentions set, the install creates the four purge queues as singletons, each
    scheduled on PURGE_CRON."""
    await _install(
        db_url,
        make_settings(
            audit_retention_days=30, orphan_user_retention_hours=48, purge_cron="15 4 * * *"
        ),
    )

    assert await _schedules(pool) == dict.fromkeys(PURGES, "15 4 * * *")
    policies = await pool.fetch(
        "SELECT name, policy FROM jobs.queue WHERE name = ANY($1::text[])", sorted(PURGES)
    )
    assert {r["name"]: r["policy"] for r in policies} == dict.fromkeys(PURGES, "singleton")


async def test_retention_zero_removes_the_schedule_and_keeps_the_queue(
    db_url: str, pool: asyncpg.Pool
) -> None:
    """Re-installing with both retentions at 0 unschedules audit-purge and orphan-user-purge;
    their queues stay and the two expiry sweeps stay scheduled."""
    await _install(db_url, make_settings(audit_retention_days=30, orphan_user_retention_hours=48))
    await _install(db_url, make_settings(audit_retention_days=0, orphan_user_retention_hours=0))

    assert set(await _schedules(pool)) == {APIKEY_EXPIRY_QUEUE, IDEMPOTENCY_PURGE_QUEUE}
    queues = await pool.fetchval(
        "SELECT count(*) FROM jobs.queue WHERE name = ANY($1::text[])", sorted(PURGES)
    )
    assert queues == 4


async def test_a_purge_job_sent_by_hand_at_retention_zero_deletes_nothing(
    db_url: str, pool: asyncpg.Pool
) -> None:
    """With the schedule gone, a job sent to either disabled purge queue still runs and completes
    without deleting any audit row or user."""
    settings = make_settings(audit_retention_days=0, orphan_user_retention_hours=0)
    await _install(db_url, settings)
    async with pool.acquire() as conn:
        await add_audit_rows(conn, 20, age=5_000 * DAY)
        user = await add_user(conn, age=5_000 * DAY)

    await run_purge_job(pool, settings, AUDIT_PURGE_QUEUE)
    await run_purge_job(pool, settings, ORPHAN_USER_PURGE_QUEUE)

    assert await pool.fetchval("SELECT count(*) FROM public.audit_log") == 20
    async with pool.acquire() as conn:
        assert await user_ids(conn) == {user}
    runs = await pool.fetch("SELECT queue, deleted FROM jobs.purge_run ORDER BY id")
    assert [(r["queue"], r["deleted"]) for r in runs] == [
        (AUDIT_PURGE_QUEUE, 0),
        (ORPHAN_USER_PURGE_QUEUE, 0),
    ]
