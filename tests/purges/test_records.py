"""What a purge run leaves behind: a log line, a metric, a run record, a last_purge in queues."""

from __future__ import annotations

import asyncpg
import pytest
from prometheus_client import REGISTRY

from worker.commands.operate import queue_report
from worker.jobs.purges import AUDIT_PURGE_QUEUE, IDEMPOTENCY_PURGE_QUEUE

from .chassis import DAY, add_audit_rows
from .runner import install_purges, make_settings, run_purge_job


def _metric(queue: str) -> float:
    value = REGISTRY.get_sample_value("purge_deleted_rows_total", {"queue": queue})
    return value or 0.0


async def test_queues_report_shows_when_each_purge_last_ran(
    db_url: str, pool: asyncpg.Pool
) -> None:
    """After two audit-purge runs the report's last_purge is the newer one; a purge that never
    ran and a non-purge queue show none."""
    settings = make_settings(audit_retention_days=30)
    async with pool.acquire() as conn:
        await add_audit_rows(conn, 7, age=40 * DAY)
    await run_purge_job(pool, settings, AUDIT_PURGE_QUEUE)
    await run_purge_job(pool, settings, AUDIT_PURGE_QUEUE)

    report = {q["name"]: q for q in await queue_report(db_url, "jobs")}

    last = report[AUDIT_PURGE_QUEUE]["last_purge"]
    newest = await pool.fetchrow(
        "SELECT started_at, finished_at FROM jobs.purge_run ORDER BY id DESC LIMIT 1"
    )
    assert newest is not None
    assert last == {
        "started_at": newest["started_at"].isoformat(),
        "finished_at": newest["finished_at"].isoformat(),
        "deleted": 0,
        "drained": True,
    }
    assert report[IDEMPOTENCY_PURGE_QUEUE]["last_purge"] is None
    assert report["usage-events"]["last_purge"] is None


async def test_a_failed_run_logs_purge_failed_and_records_nothing(
    pool: asyncpg.Pool, captured_logs: list[dict[str, object]]
) -> None:
    """When the table is missing, the handler raises (failing the job), logs purge.failed and
    writes no run record."""
    await pool.execute("DROP TABLE public.idempotency_keys")

    with pytest.raises(asyncpg.UndefinedTableError):
        await run_purge_job(pool, make_settings(), IDEMPOTENCY_PURGE_QUEUE)

    assert [e["event"] for e in captured_logs if str(e["event"]).startswith("purge.")] == [
        "purge.failed"
    ]
    assert await pool.fetchval("SELECT count(*) FROM jobs.purge_run") == 0


async def test_run_records_older_than_90_days_are_pruned(pool: asyncpg.Pool) -> None:
    """Each run of a queue drops that queue's run records older than 90 days, keeping the rest."""
    await install_purges(pool, make_settings())
    await pool.execute(
        "INSERT INTO jobs.purge_run (queue, started_at, deleted) VALUES "
        "($1, now() - interval '91 days', 1), ($1, now() - interval '89 days', 2), "
        "('other', now() - interval '200 days', 3)",
        IDEMPOTENCY_PURGE_QUEUE,
    )

    await run_purge_job(pool, make_settings(), IDEMPOTENCY_PURGE_QUEUE)

    left = await pool.fetch("SELECT queue, deleted FROM jobs.purge_run ORDER BY id")
    assert [(r["queue"], r["deleted"]) for r in left] == [
        (IDEMPOTENCY_PURGE_QUEUE, 2),
        ("other", 3),
        (IDEMPOTENCY_PURGE_QUEUE, 0),
    ]


async def test_deleted_rows_are_counted_per_queue(pool: asyncpg.Pool) -> None:
    """purge_deleted_rows_total{queue} grows by the rows each run deleted, on its own label."""
    async with pool.acquire() as conn:
        await add_audit_rows(conn, 42, age=40 * DAY)
    audit_before = _metric(AUDIT_PURGE_QUEUE)
    other_before = _metric(IDEMPOTENCY_PURGE_QUEUE)

    await run_purge_job(pool, make_settings(audit_retention_days=30), AUDIT_PURGE_QUEUE)

    assert _metric(AUDIT_PURGE_QUEUE) - audit_before == 42
    assert _metric(IDEMPOTENCY_PURGE_QUEUE) == other_before
