"""audit-purge: old audit rows go in bounded, index-backed batches until the tail is drained."""

from __future__ import annotations

import json
from datetime import timedelta

import asyncpg
import pytest
from prometheus_client import REGISTRY

from worker.jobs.purges import AUDIT_PURGE_QUEUE, sql
from worker.jobs.purges.audit import audit_body
from worker.jobs.purges.batches import BatchLimits, StatementTimeout

from .chassis import DAY, add_audit_rows
from .runner import make_settings, run_body, run_purge_job


async def _ages(pool: asyncpg.Pool) -> tuple[int, int]:
    row = await pool.fetchrow(
        "SELECT count(*) FILTER (WHERE created_at < now() - interval '30 days') AS old, "
        "count(*) FILTER (WHERE created_at >= now() - interval '30 days') AS young "
        "FROM public.audit_log"
    )
    assert row is not None
    return row["old"], row["young"]


def _deleted_metric() -> float:
    value = REGISTRY.get_sample_value("purge_deleted_rows_total", {"queue": AUDIT_PURGE_QUEUE})
    return value or 0.0


async def test_old_rows_are_deleted_in_batches_of_5000_until_drained(
    pool: asyncpg.Pool, captured_logs: list[dict[str, object]]
) -> None:
    """12,500 rows past a 30-day retention go in three batches; 300 younger rows stay."""
    async with pool.acquire() as conn:
        await add_audit_rows(conn, 12_500, age=31 * DAY)
        await add_audit_rows(conn, 300, age=29 * DAY)
    before = _deleted_metric()

    await run_purge_job(pool, make_settings(audit_retention_days=30), AUDIT_PURGE_QUEUE)

    assert await _ages(pool) == (0, 300)
    assert _deleted_metric() - before == 12_500
    ran = [e for e in captured_logs if e["event"] == "purge.ran"]
    assert len(ran) == 1
    assert ran[0]["queue"] == AUDIT_PURGE_QUEUE
    assert ran[0]["deleted"] == 12_500
    assert ran[0]["retention"] == "30 days"
    assert ran[0]["batches"] == 3
    assert ran[0]["drained"] is True
    assert isinstance(ran[0]["duration_seconds"], float)
    record = await pool.fetchrow("SELECT * FROM jobs.purge_run WHERE queue = $1", AUDIT_PURGE_QUEUE)
    assert record is not None
    assert record["deleted"] == 12_500
    assert record["drained"] is True
    assert json.loads(record["details"])["batches"] == 3


async def test_the_batch_cap_stops_a_run_and_the_oldest_rows_go_first(pool: asyncpg.Pool) -> None:
    """With two batches of 1,000 allowed, the 2,000 oldest of 3,500 old rows go and the run says
    it did not drain."""
    async with pool.acquire() as conn:
        await add_audit_rows(conn, 3_500, age=40 * DAY)
        newest_gone = await conn.fetchval(
            "SELECT created_at FROM public.audit_log ORDER BY created_at OFFSET 1999 LIMIT 1"
        )
    limits = BatchLimits(batch_size=1_000, max_batches=2)

    run = await run_body(pool, AUDIT_PURGE_QUEUE, audit_body(30, limits))

    assert run.deleted == 2_000
    assert run.drained is False
    assert run.details["batches"] == 2
    oldest_left = await pool.fetchval("SELECT min(created_at) FROM public.audit_log")
    assert oldest_left > newest_gone
    assert await pool.fetchval("SELECT count(*) FROM public.audit_log") == 1_500
    drained = await pool.fetchval("SELECT drained FROM jobs.purge_run")
    assert drained is False


async def test_the_time_budget_stops_a_run_after_its_first_batch(pool: asyncpg.Pool) -> None:
    """A spent time budget lets one batch run and leaves the rest for the next run."""
    async with pool.acquire() as conn:
        await add_audit_rows(conn, 250, age=40 * DAY)
    limits = BatchLimits(batch_size=100, time_budget_seconds=0.0)

    run = await run_body(pool, AUDIT_PURGE_QUEUE, audit_body(30, limits))

    assert (run.deleted, run.drained, run.details["batches"]) == (100, False, 1)
    assert await pool.fetchval("SELECT count(*) FROM public.audit_log") == 150


async def test_retention_zero_deletes_nothing(
    pool: asyncpg.Pool, captured_logs: list[dict[str, object]]
) -> None:
    """With AUDIT_RETENTION_DAYS=0 an audit-purge job keeps every row, however old."""
    async with pool.acquire() as conn:
        await add_audit_rows(conn, 50, age=3_650 * DAY)

    await run_purge_job(pool, make_settings(audit_retention_days=0), AUDIT_PURGE_QUEUE)

    assert await pool.fetchval("SELECT count(*) FROM public.audit_log") == 50
    ran = [e for e in captured_logs if e["event"] == "purge.ran"]
    assert [(e["deleted"], e["retention"]) for e in ran] == [(0, "disabled")]


async def test_a_row_exactly_at_the_cutoff_stays(pool: asyncpg.Pool) -> None:
    """Only rows strictly older than the retention go; one created at the cutoff instant stays."""
    async with pool.acquire() as conn:
        clock = await conn.fetchval("SELECT now()")
        await conn.execute(
            "INSERT INTO public.audit_log (actor_via, action, resource_type, created_at) "
            "VALUES ('user', 'a', 'b', $1::timestamptz - interval '30 days'), "
            "('user', 'a', 'b', $1::timestamptz - interval '30 days' - interval '1 ms')",
            clock,
        )

    run = await run_body(pool, AUDIT_PURGE_QUEUE, audit_body(30), now=clock)

    assert run.deleted == 1
    assert await pool.fetchval("SELECT count(*) FROM public.audit_log") == 1


async def test_the_batch_statement_uses_the_created_at_index(pool: asyncpg.Pool) -> None:
    """On a table whose tail is small, the batch finds its rows through audit_log(created_at)."""
    async with pool.acquire() as conn:
        await add_audit_rows(conn, 20_000, age=timedelta(days=1))
        await add_audit_rows(conn, 500, age=60 * DAY)
        await conn.execute("ANALYZE public.audit_log")
        clock = await conn.fetchval("SELECT now()")
        plan = await conn.fetchval(
            "EXPLAIN (FORMAT JSON) " + sql.DELETE_AUDIT_BATCH.text,
            *sql.DELETE_AUDIT_BATCH.args({"now": clock, "retention_days": 30, "limit": 5000}),
        )

    assert "audit_log_created_at_idx" in json.dumps(json.loads(plan))


async def test_a_batch_past_its_statement_cap_fails_the_run_by_name(
    pool: asyncpg.Pool, db_url: str, captured_logs: list[dict[str, object]]
) -> None:
    """A batch stuck behind a row lock is cancelled at its cap and fails the run with
    StatementTimeout (not a bare TimeoutError the poller would read as the job's expiry)."""
    async with pool.acquire() as conn:
        await add_audit_rows(conn, 10, age=40 * DAY)
    blocker = await asyncpg.connect(db_url)
    try:
        await blocker.execute("BEGIN")
        await blocker.execute("SELECT 1 FROM public.audit_log FOR UPDATE")
        limits = BatchLimits(statement_timeout_seconds=0.3)
        with pytest.raises(StatementTimeout, match=r"a purge batch ran past 0\.3s"):
            await run_body(pool, AUDIT_PURGE_QUEUE, audit_body(30, limits))
    finally:
        await blocker.close()

    assert await pool.fetchval("SELECT count(*) FROM public.audit_log") == 10
    assert [e["event"] for e in captured_logs if str(e["event"]).startswith("purge.")] == [
        "purge.failed"
    ]
