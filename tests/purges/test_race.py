"""orphan-user-purge under concurrent writers: a membership or sign-in landing mid-sweep wins."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta

import anyio
import asyncpg
import pytest

from worker.jobs.purges import ORPHAN_USER_PURGE_QUEUE
from worker.jobs.purges.orphan_users import OrphanRule, orphan_body
from worker.jobs.purges.runs import PurgeRun

from .chassis import (
    HOUR,
    add_account,
    add_membership,
    add_session,
    add_user,
    count,
    orphan_audit_rows,
    user_ids,
)
from .runner import run_body

RULE = OrphanRule(retention_hours=24)


async def wait_for_lock_waiters(conn: asyncpg.Connection, n: int) -> None:
    """Block until ``n`` backends of this database wait on a lock (fails after 10 s)."""
    with anyio.fail_after(10):
        while True:
            waiting = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if waiting >= n:
                return
            await anyio.sleep(0.02)


async def sweep_while_held(
    pool: asyncpg.Pool, writer: asyncpg.Connection, *, now: datetime | None = None
) -> PurgeRun:
    """Start a sweep while ``writer`` holds an open transaction, commit it once the sweep waits
    on it, and return the finished run."""
    sweep = asyncio.ensure_future(
        run_body(pool, ORPHAN_USER_PURGE_QUEUE, orphan_body(RULE), now=now)
    )
    try:
        async with pool.acquire() as observer:
            await wait_for_lock_waiters(observer, 1)
    except BaseException:
        sweep.cancel()
        raise
    await writer.execute("COMMIT")
    return await sweep


@pytest.mark.parametrize("deactivated", [False, True])
async def test_a_membership_inserted_mid_sweep_is_never_deleted_with_its_user(
    pool: asyncpg.Pool, db_url: str, deactivated: bool
) -> None:
    """A candidate whose membership insert is in flight when the sweep reaches it is kept, and so
    is the membership, once the insert commits."""
    async with pool.acquire() as conn:
        user = await add_user(conn)
        await add_account(conn, user)
    writer = await asyncpg.connect(db_url)
    try:
        await writer.execute("BEGIN")
        # Not yet visible to the candidate scan; holds FOR KEY SHARE on the user row.
        await add_membership(writer, user, deactivated=deactivated)
        run = await sweep_while_held(pool, writer)
    finally:
        await writer.close()

    assert run.deleted == 0
    assert run.details["kept_on_recheck"] == 1
    async with pool.acquire() as conn:
        assert await user_ids(conn) == {user}
        assert await count(conn, "workspace_members", user) == 1
        assert await count(conn, "account", user) == 1


async def test_a_sign_in_mid_sweep_keeps_the_user(pool: asyncpg.Pool, db_url: str) -> None:
    """A session created for a candidate while the sweep runs keeps the user."""
    async with pool.acquire() as conn:
        user = await add_user(conn)
    writer = await asyncpg.connect(db_url)
    try:
        await writer.execute("BEGIN")
        await add_session(writer, user, expires_in=HOUR)
        run = await sweep_while_held(pool, writer)
    finally:
        await writer.close()

    assert (run.deleted, run.details["kept_on_recheck"]) == (0, 1)
    async with pool.acquire() as conn:
        assert await user_ids(conn) == {user}
        assert await count(conn, "session", user) == 1


async def test_the_recheck_measures_sessions_against_the_run_clock(
    pool: asyncpg.Pool, db_url: str
) -> None:
    """A session that lands mid-sweep, live at the run's clock but expired by the wall clock,
    keeps the user: the re-check uses the run's instant, not now()."""
    async with pool.acquire() as conn:
        user = await add_user(conn, age=timedelta(days=5))
        clock = await conn.fetchval("SELECT now() - interval '2 hours'")
    writer = await asyncpg.connect(db_url)
    try:
        await writer.execute("BEGIN")
        await add_session(writer, user, expires_in=-HOUR)
        run = await sweep_while_held(pool, writer, now=clock)
    finally:
        await writer.close()

    assert (run.deleted, run.details["kept_on_recheck"]) == (0, 1)
    async with pool.acquire() as conn:
        assert await user_ids(conn) == {user}


async def test_a_membership_insert_after_the_lock_fails_instead_of_surviving_its_user(
    pool: asyncpg.Pool, db_url: str
) -> None:
    """When the sweep holds the user row first, a membership insert waits, then fails on the
    foreign key: no membership row ever outlives the deleted user."""
    async with pool.acquire() as conn:
        user = await add_user(conn)
        await add_account(conn, user)
    holder = await asyncpg.connect(db_url)
    joiner = await asyncpg.connect(db_url)
    try:
        # The account row lock stalls the sweep's cascade after it locked the user row.
        await holder.execute("BEGIN")
        await holder.execute("SELECT 1 FROM public.account WHERE user_id = $1 FOR UPDATE", user)
        sweep = asyncio.ensure_future(run_body(pool, ORPHAN_USER_PURGE_QUEUE, orphan_body(RULE)))
        async with pool.acquire() as observer:
            await wait_for_lock_waiters(observer, 1)
            join = asyncio.ensure_future(add_membership(joiner, user))
            await wait_for_lock_waiters(observer, 2)
        await holder.execute("COMMIT")
        run = await sweep
        with pytest.raises(asyncpg.ForeignKeyViolationError):
            await join
    finally:
        await holder.close()
        await joiner.close()

    assert run.deleted == 1
    async with pool.acquire() as conn:
        assert await user_ids(conn) == set()
        assert await conn.fetchval("SELECT count(*) FROM public.workspace_members") == 0


async def test_a_run_that_dies_mid_sweep_leaves_an_exact_audit_row(
    pool: asyncpg.Pool, db_url: str
) -> None:
    """When the sweep's connection dies while it waits on its second user, the first user's
    deletion is already in the run's audit row, and nothing else is."""
    async with pool.acquire() as conn:
        await add_user(conn, email="first@example.com", age=timedelta(days=5))
        second = await add_user(conn, email="second@example.com", age=timedelta(days=4))
    writer = await asyncpg.connect(db_url)
    try:
        await writer.execute("BEGIN")
        await writer.execute('SELECT 1 FROM public."user" WHERE id = $1 FOR UPDATE', second)
        sweep = asyncio.ensure_future(run_body(pool, ORPHAN_USER_PURGE_QUEUE, orphan_body(RULE)))
        async with pool.acquire() as observer:
            await wait_for_lock_waiters(observer, 1)
            # As a crash or a database restart would: the sweep's backend goes away mid-run.
            await observer.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError)):
            await sweep
        await writer.execute("ROLLBACK")
    finally:
        await writer.close()

    async with pool.acquire() as conn:
        assert await user_ids(conn) == {second}
        rows = await orphan_audit_rows(conn)
    assert len(rows) == 1
    assert json.loads(rows[0]["metadata"]) == {
        "deleted": 1,
        "retention_hours": 24,
        "sample": ["first@example.com"],
    }
