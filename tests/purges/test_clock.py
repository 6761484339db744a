"""One clock per pass: every statement of a run measures against one instant read at its start."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta

import asyncpg

from api_sender.query import Query, Rendered
from worker.jobs.purges import (
    APIKEY_EXPIRY_QUEUE,
    AUDIT_PURGE_QUEUE,
    IDEMPOTENCY_PURGE_QUEUE,
    ORPHAN_USER_PURGE_QUEUE,
    sql,
)
from worker.jobs.purges.apikeys import retire_expired_api_keys
from worker.jobs.purges.audit import audit_body
from worker.jobs.purges.idempotency import purge_idempotency_keys
from worker.jobs.purges.orphan_users import OrphanRule, orphan_body

from .chassis import DAY, HOUR, add_audit_rows, add_invitation, add_session, add_user, user_ids
from .runner import run_body


async def _two_hours_ago(pool: asyncpg.Pool) -> datetime:
    value: datetime = await pool.fetchval("SELECT now() - interval '2 hours'")
    return value


async def test_orphan_candidates_are_judged_at_the_run_clock(pool: asyncpg.Pool) -> None:
    """Against a clock two hours back, a user old only by the wall clock, a session and an
    invitation that expired since that clock all still protect; a plain orphan goes."""
    async with pool.acquire() as conn:
        young_then = await add_user(conn, age=timedelta(hours=2, minutes=30))
        signed_in_then = await add_user(conn, age=5 * HOUR)
        await add_session(conn, signed_in_then, expires_in=-HOUR)
        invited_then = await add_user(conn, email="then@example.com", age=5 * HOUR)
        await add_invitation(conn, "then@example.com", expires_in=-HOUR)
        await add_user(conn, age=5 * HOUR)
    clock = await _two_hours_ago(pool)

    run = await run_body(
        pool, ORPHAN_USER_PURGE_QUEUE, orphan_body(OrphanRule(retention_hours=1)), now=clock
    )

    # Excluded by the candidate query at the run's clock, not only by the re-check under the lock.
    assert (run.deleted, run.details["kept_on_recheck"]) == (1, 0)
    async with pool.acquire() as conn:
        assert await user_ids(conn) == {young_then, signed_in_then, invited_then}
        stamped = await conn.fetchval(
            "SELECT created_at FROM public.audit_log WHERE action = 'user.orphan_purge'"
        )
    assert stamped == clock


async def test_expiry_sweeps_are_judged_at_the_run_clock(pool: asyncpg.Pool) -> None:
    """A key and a replay row that expired an hour ago are still live at a clock two hours back."""
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO public.api_keys (id, workspace_id, name, key_hash, expires_at) "
            "VALUES ('k', 'w1', 'k', 'h', now() - interval '1 hour')"
        )
        await conn.execute(
            "INSERT INTO public.idempotency_keys (workspace_id, key, response, expires_at) "
            "VALUES ('w1', 'k', '{}', now() - interval '1 hour')"
        )
    clock = await _two_hours_ago(pool)

    keys = await run_body(pool, APIKEY_EXPIRY_QUEUE, retire_expired_api_keys, now=clock)
    replays = await run_body(pool, IDEMPOTENCY_PURGE_QUEUE, purge_idempotency_keys, now=clock)

    assert (keys.deleted, replays.deleted) == (0, 0)
    assert await pool.fetchval("SELECT revoked_at FROM public.api_keys") is None
    assert await pool.fetchval("SELECT count(*) FROM public.idempotency_keys") == 1


async def test_audit_retention_is_counted_from_the_run_clock(pool: asyncpg.Pool) -> None:
    """An audit row 30 days and one hour old is within a 30-day retention at a clock 2 h back."""
    async with pool.acquire() as conn:
        await add_audit_rows(conn, 10, age=30 * DAY + HOUR)
    clock = await _two_hours_ago(pool)

    run = await run_body(pool, AUDIT_PURGE_QUEUE, audit_body(30), now=clock)

    assert run.deleted == 0
    assert await pool.fetchval("SELECT count(*) FROM public.audit_log") == 10


async def test_a_run_records_and_logs_the_instant_it_read(
    pool: asyncpg.Pool, captured_logs: list[dict[str, object]]
) -> None:
    """The run record's start and the logged clock are the one instant the run read."""
    async with pool.acquire() as conn:
        await add_user(conn)
        before = await conn.fetchval("SELECT now()")

    await run_body(pool, ORPHAN_USER_PURGE_QUEUE, orphan_body(OrphanRule(retention_hours=1)))

    record = await pool.fetchrow("SELECT started_at, details FROM jobs.purge_run")
    assert record is not None
    stamped = await pool.fetchval(
        "SELECT created_at FROM public.audit_log WHERE action = 'user.orphan_purge'"
    )
    assert before < record["started_at"] == stamped
    ran = [e for e in captured_logs if e["event"] == "purge.ran"]
    assert ran[0]["clock"] == record["started_at"].isoformat()
    assert json.loads(record["details"])["retention"] == "1 hour"


def test_no_purge_statement_reads_the_clock_itself() -> None:
    """Only the clock read calls now(); every other purge statement takes the instant as a
    parameter."""
    statements = {
        name: value.text if isinstance(value, Rendered) else value.sql
        for name, value in vars(sql).items()
        if name.isupper() and isinstance(value, Rendered | Query)
    }
    assert {"READ_CLOCK", "DELETE_AUDIT_BATCH", "ORPHAN_CANDIDATES", "RECORD_RUN"} <= set(
        statements
    )
    clock = re.compile(
        r"\b(now\s*\(|current_timestamp|clock_timestamp|statement_timestamp|transaction_timestamp)",
        re.I,
    )
    readers = {
        name
        for name, text in statements.items()
        if clock.search(re.sub(r"--[^\n]*", "", text))  # comments may say "now"
    }
    assert readers == {"READ_CLOCK"}
