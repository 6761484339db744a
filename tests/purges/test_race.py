"""orphan-user-purge under concurrent writers: anything that keeps a user, landing mid-sweep, wins.

Each exclusion of contract section 7 is raced two ways: committed between the candidate scan and
the user's delete (through the sweep's ``scanned`` signal), and in flight while the sweep
re-checks (an open transaction committed once the sweep waits on it).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import anyio
import asyncpg
import pytest

from worker.jobs.purges import ORPHAN_USER_PURGE_QUEUE
from worker.jobs.purges.orphan_users import OrphanRule, orphan_body
from worker.jobs.purges.runs import PurgeBody, PurgeRun

from .chassis import (
    HOUR,
    add_account,
    add_invitation,
    add_membership,
    add_session,
    add_user,
    count,
    orphan_audit_rows,
    set_operator,
    user_ids,
)
from .runner import run_body

RULE = OrphanRule(retention_hours=24)
BOSS = "boss@example.com"
GUARDED = OrphanRule(retention_hours=24, superadmins=frozenset({BOSS}))


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


async def lock_waiters(conn: asyncpg.Connection) -> int:
    """How many backends of this database wait on a lock right now."""
    waiting: int = await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    return waiting


async def sweep_while_held(
    pool: asyncpg.Pool,
    writer: asyncpg.Connection,
    *,
    now: datetime | None = None,
    body: PurgeBody | None = None,
) -> PurgeRun:
    """Start a sweep while ``writer`` holds an open transaction, commit it once the sweep waits
    on a lock (or has finished without waiting: then it never saw the write), and return the
    finished run."""
    sweep = asyncio.ensure_future(
        run_body(pool, ORPHAN_USER_PURGE_QUEUE, body or orphan_body(RULE), now=now)
    )
    try:
        async with pool.acquire() as observer:
            with anyio.fail_after(10):
                while not sweep.done() and await lock_waiters(observer) < 1:
                    await anyio.sleep(0.02)
    except BaseException:
        sweep.cancel()
        raise
    await writer.execute("COMMIT")
    return await sweep


async def sweep_with_step(
    pool: asyncpg.Pool, db_url: str, step: Callable[[asyncpg.Connection], Awaitable[object]]
) -> PurgeRun:
    """Run a sweep that, once its first candidate scan is done and before any re-check, lets
    ``step`` commit a change on a connection of its own."""
    steps = 0

    async def scanned() -> None:
        nonlocal steps
        if steps == 0:
            conn = await asyncpg.connect(db_url)
            try:
                await step(conn)
            finally:
                await conn.close()
        steps += 1

    with anyio.fail_after(30):
        run = await run_body(pool, ORPHAN_USER_PURGE_QUEUE, orphan_body(GUARDED, scanned))
    assert steps >= 1, "the sweep never scanned"
    return run


async def drop_operator_foreign_key(conn: asyncpg.Connection) -> None:
    """Make instance_settings an app's own table whose operator_user_id has no foreign key."""
    name = await conn.fetchval(
        "SELECT conname FROM pg_constraint "
        "WHERE conrelid = 'public.instance_settings'::regclass AND contype = 'f'"
    )
    assert name is not None
    await conn.execute(f"ALTER TABLE public.instance_settings DROP CONSTRAINT {name}")


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


async def operator_of(conn: asyncpg.Connection) -> str | None:
    """The instance operator's user id."""
    value: str | None = await conn.fetchval(
        "SELECT operator_user_id FROM public.instance_settings WHERE id = 1"
    )
    return value


async def test_an_invitation_committed_after_the_scan_keeps_the_user(
    pool: asyncpg.Pool, db_url: str
) -> None:
    """A live invitation for a candidate's email (in another letter case) committed between the
    scan and the delete keeps the user: the re-check tests invitations too."""
    async with pool.acquire() as conn:
        user = await add_user(conn, email="late.invite@example.com")

    run = await sweep_with_step(
        pool, db_url, lambda conn: add_invitation(conn, "Late.Invite@Example.com")
    )

    assert (run.deleted, run.details["kept_on_recheck"]) == (0, 1)
    async with pool.acquire() as conn:
        assert await user_ids(conn) == {user}
        assert await conn.fetchval("SELECT count(*) FROM public.invitations") == 1


@pytest.mark.parametrize("isolation", ["read committed", "repeatable read"])
async def test_an_invitation_in_flight_during_the_recheck_keeps_the_user(
    pool: asyncpg.Pool, db_url: str, isolation: str
) -> None:
    """An invitation insert for a candidate's email that is open while the sweep re-checks makes
    the sweep wait for it, then keep the user (no foreign key covers invitations), even where
    the database's default isolation would freeze the snapshot before the wait."""
    async with pool.acquire() as conn:
        user = await add_user(conn, email="pending@example.com")
    sweeping = await asyncpg.create_pool(
        db_url, min_size=1, max_size=4, server_settings={"default_transaction_isolation": isolation}
    )
    writer = await asyncpg.connect(db_url)
    try:
        await writer.execute("BEGIN")
        await add_invitation(writer, "pending@example.com")
        run = await sweep_while_held(sweeping, writer)
    finally:
        await writer.close()
        await sweeping.close()

    assert (run.deleted, run.details["kept_on_recheck"]) == (0, 1)
    async with pool.acquire() as conn:
        assert await user_ids(conn) == {user}


@pytest.mark.parametrize("foreign_key", [True, False])
async def test_an_operator_set_after_the_scan_keeps_the_user(
    pool: asyncpg.Pool, db_url: str, foreign_key: bool
) -> None:
    """A candidate made instance_settings.operator_user_id between the scan and the delete is
    kept, and so is the setting, with or without a foreign key on the app's column."""
    async with pool.acquire() as conn:
        if not foreign_key:
            await drop_operator_foreign_key(conn)
        user = await add_user(conn)

    run = await sweep_with_step(pool, db_url, lambda conn: set_operator(conn, user))

    assert (run.deleted, run.details["kept_on_recheck"]) == (0, 1)
    async with pool.acquire() as conn:
        assert await user_ids(conn) == {user}
        assert await operator_of(conn) == user


@pytest.mark.parametrize("foreign_key", [True, False])
@pytest.mark.parametrize("existing_row", [True, False])
async def test_an_operator_change_in_flight_during_the_recheck_keeps_the_user(
    pool: asyncpg.Pool, db_url: str, foreign_key: bool, existing_row: bool
) -> None:
    """An open transaction that makes a candidate the operator (updating the settings row or
    inserting it) makes the sweep wait for it, then keep the user, with or without a foreign
    key on the app's column."""
    async with pool.acquire() as conn:
        if not foreign_key:
            await drop_operator_foreign_key(conn)
        user = await add_user(conn)
        if existing_row:
            await set_operator(conn, None)
    writer = await asyncpg.connect(db_url)
    try:
        await writer.execute("BEGIN")
        await set_operator(writer, user)
        run = await sweep_while_held(pool, writer)
    finally:
        await writer.close()

    assert (run.deleted, run.details["kept_on_recheck"]) == (0, 1)
    async with pool.acquire() as conn:
        assert await user_ids(conn) == {user}
        assert await operator_of(conn) == user


async def test_a_superadmin_verified_after_the_scan_keeps_the_user(
    pool: asyncpg.Pool, db_url: str
) -> None:
    """A candidate that verifies a superadmin address between the scan and the delete is kept:
    the re-check reads the locked row's email and verification, not the scan's."""
    async with pool.acquire() as conn:
        user = await add_user(conn, email=BOSS, verified=False)

    run = await sweep_with_step(
        pool,
        db_url,
        lambda conn: conn.execute(
            'UPDATE public."user" SET email_verified = true WHERE id = $1', user
        ),
    )

    assert (run.deleted, run.details["kept_on_recheck"]) == (0, 1)
    async with pool.acquire() as conn:
        assert await user_ids(conn) == {user}


async def test_an_email_change_in_flight_to_an_invited_address_keeps_the_user(
    pool: asyncpg.Pool, db_url: str
) -> None:
    """A candidate whose email is being changed to an address with a live invitation (the
    update open while the sweep re-checks) is kept: the re-check waits on the row, then reads
    the new email."""
    async with pool.acquire() as conn:
        user = await add_user(conn, email="old@example.com")
        await add_invitation(conn, "new@example.com")
    writer = await asyncpg.connect(db_url)
    try:
        await writer.execute("BEGIN")
        await writer.execute(
            'UPDATE public."user" SET email = $2 WHERE id = $1', user, "new@example.com"
        )
        run = await sweep_while_held(pool, writer, body=orphan_body(GUARDED))
    finally:
        await writer.close()

    assert (run.deleted, run.details["kept_on_recheck"]) == (0, 1)
    async with pool.acquire() as conn:
        assert await user_ids(conn) == {user}


async def test_an_app_transaction_holding_invitations_stops_the_sweep_instead_of_stalling_it(
    pool: asyncpg.Pool, db_url: str
) -> None:
    """While an app transaction keeps an invitation write open for longer than the sweep may
    wait, the sweep gives up within its bounded wait, keeps its candidate for the next run, and
    says so; it neither deletes unguarded nor blocks the app for long."""
    async with pool.acquire() as conn:
        user = await add_user(conn)
    writer = await asyncpg.connect(db_url)
    try:
        await writer.execute("BEGIN")
        await add_invitation(writer, "someone.else@example.com")
        with anyio.fail_after(10):
            run = await run_body(pool, ORPHAN_USER_PURGE_QUEUE, orphan_body(RULE))
        await writer.execute("COMMIT")
    finally:
        await writer.close()

    assert (run.deleted, run.drained, run.details["tables_busy"]) == (0, False, True)
    async with pool.acquire() as conn:
        assert await user_ids(conn) == {user}
