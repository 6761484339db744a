"""apikey-expiry-sweep and idempotency-purge: rows past their own expires_at."""

from __future__ import annotations

from datetime import timedelta

import asyncpg

from worker.jobs.purges import APIKEY_EXPIRY_QUEUE, IDEMPOTENCY_PURGE_QUEUE

from .chassis import DAY, HOUR
from .runner import make_settings, run_purge_job


async def _add_key(
    conn: asyncpg.Connection,
    key_id: str,
    *,
    expires_in: timedelta | None,
    revoked_ago: timedelta | None = None,
) -> None:
    await conn.execute(
        "INSERT INTO public.api_keys (id, workspace_id, name, key_hash, expires_at, revoked_at) "
        "VALUES ($1, 'w1', $1, 'hash-' || $1, now() + $2::interval, now() - $3::interval)",
        key_id,
        expires_in,
        revoked_ago,
    )


async def test_expired_unrevoked_keys_are_revoked_at_their_expiry(pool: asyncpg.Pool) -> None:
    """An expired, unrevoked key gets revoked_at = expires_at; live, expiry-less and already
    revoked keys keep what they had."""
    async with pool.acquire() as conn:
        await _add_key(conn, "expired", expires_in=-2 * HOUR)
        await _add_key(conn, "live", expires_in=DAY)
        await _add_key(conn, "forever", expires_in=None)
        await _add_key(conn, "revoked", expires_in=-2 * HOUR, revoked_ago=3 * DAY)
        before = {r["id"]: r for r in await conn.fetch("SELECT * FROM public.api_keys")}

    await run_purge_job(pool, make_settings(), APIKEY_EXPIRY_QUEUE)

    after = {r["id"]: r for r in await pool.fetch("SELECT * FROM public.api_keys")}
    assert after["expired"]["revoked_at"] == before["expired"]["expires_at"]
    for untouched in ("live", "forever", "revoked"):
        assert after[untouched]["revoked_at"] == before[untouched]["revoked_at"]
    assert after["live"]["revoked_at"] is None
    assert await pool.fetchval("SELECT deleted FROM jobs.purge_run") == 1


async def test_a_second_sweep_changes_nothing(pool: asyncpg.Pool) -> None:
    """The sweep is idempotent: a key it retired is not counted or touched again."""
    async with pool.acquire() as conn:
        await _add_key(conn, "expired", expires_in=-HOUR)

    await run_purge_job(pool, make_settings(), APIKEY_EXPIRY_QUEUE)
    await run_purge_job(pool, make_settings(), APIKEY_EXPIRY_QUEUE)

    deleted = await pool.fetch("SELECT deleted FROM jobs.purge_run ORDER BY id")
    assert [r["deleted"] for r in deleted] == [1, 0]


async def test_idempotency_rows_past_expiry_go_and_live_ones_stay(pool: asyncpg.Pool) -> None:
    """6,001 expired replay rows go (over two batches) and the 20 unexpired ones stay."""
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO public.idempotency_keys (workspace_id, key, response, expires_at) "
            "SELECT 'w1', 'old-' || g, '{}'::jsonb, now() - interval '1 minute' * g "
            "FROM generate_series(1, 6001) g"
        )
        await conn.execute(
            "INSERT INTO public.idempotency_keys (workspace_id, key, response, expires_at) "
            "SELECT 'w1', 'new-' || g, '{}'::jsonb, now() + interval '1 hour' "
            "FROM generate_series(1, 20) g"
        )

    await run_purge_job(pool, make_settings(), IDEMPOTENCY_PURGE_QUEUE)

    left = await pool.fetch("SELECT key FROM public.idempotency_keys")
    assert len(left) == 20
    assert all(r["key"].startswith("new-") for r in left)
    record = await pool.fetchrow("SELECT deleted, details FROM jobs.purge_run")
    assert record is not None
    assert record["deleted"] == 6001
    assert '"batches": 2' in record["details"]
