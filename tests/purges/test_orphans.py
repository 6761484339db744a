"""orphan-user-purge: the candidate rule of contract section 7; the whole user or nothing."""

from __future__ import annotations

import json
import uuid

import asyncpg
import pytest

from worker.jobs.purges import ORPHAN_USER_PURGE_QUEUE
from worker.jobs.purges.batches import BatchLimits
from worker.jobs.purges.orphan_users import ExclusionLockDenied, OrphanRule, orphan_body

from .chassis import (
    DAY,
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
from .runner import make_settings, run_body, run_purge_job

SETTINGS = make_settings(
    orphan_user_retention_hours=24, superadmin_emails=" Boss@Example.com ,ops@example.com"
)


async def sweep(pool: asyncpg.Pool) -> None:
    """Run one orphan-user-purge job with a 24-hour retention."""
    await run_purge_job(pool, SETTINGS, ORPHAN_USER_PURGE_QUEUE)


async def test_a_plain_orphan_is_deleted_with_its_sessions_and_accounts(pool: asyncpg.Pool) -> None:
    """An old user with no membership, only an expired session and an account goes whole."""
    async with pool.acquire() as conn:
        user = await add_user(conn)
        await add_session(conn, user, expires_in=-HOUR)
        await add_account(conn, user)

    await sweep(pool)

    async with pool.acquire() as conn:
        assert await user_ids(conn) == set()
        assert await count(conn, "session", user) == 0
        assert await count(conn, "account", user) == 0


async def test_an_orphan_with_a_live_session_is_kept(pool: asyncpg.Pool) -> None:
    """A user signed in right now is a legitimate zero-membership user and stays."""
    async with pool.acquire() as conn:
        user = await add_user(conn)
        await add_session(conn, user, expires_in=HOUR)
        await add_account(conn, user)

    await sweep(pool)

    async with pool.acquire() as conn:
        assert await user_ids(conn) == {user}
        assert await count(conn, "account", user) == 1


async def test_a_user_with_only_a_deactivated_membership_is_kept(pool: asyncpg.Pool) -> None:
    """Any membership row, even a deactivated one, keeps the user and the row."""
    async with pool.acquire() as conn:
        user = await add_user(conn)
        await add_membership(conn, user, deactivated=True)

    await sweep(pool)

    async with pool.acquire() as conn:
        assert await user_ids(conn) == {user}
        assert await count(conn, "workspace_members", user) == 1


async def test_a_live_invitation_in_another_letter_case_keeps_the_orphan(
    pool: asyncpg.Pool,
) -> None:
    """A pending, unexpired invitation for the user's email in any letter case keeps the user."""
    async with pool.acquire() as conn:
        user = await add_user(conn, email="Invitee@Example.com")
        await add_invitation(conn, "invitee@EXAMPLE.COM")

    await sweep(pool)

    async with pool.acquire() as conn:
        assert await user_ids(conn) == {user}


async def test_only_a_live_pending_invitation_protects(pool: asyncpg.Pool) -> None:
    """Expired, accepted or revoked invitations do not keep an orphan."""
    async with pool.acquire() as conn:
        expired = await add_user(conn, email="expired@example.com")
        await add_invitation(conn, "expired@example.com", expires_in=-HOUR)
        accepted = await add_user(conn, email="accepted@example.com")
        await add_invitation(conn, "accepted@example.com", accepted=True)
        revoked = await add_user(conn, email="revoked@example.com")
        await add_invitation(conn, "revoked@example.com", revoked=True)

    await sweep(pool)

    async with pool.acquire() as conn:
        assert not (await user_ids(conn)) & {expired, accepted, revoked}


async def test_a_verified_superadmin_is_kept(pool: asyncpg.Pool) -> None:
    """A verified user whose email is on SUPERADMIN_EMAILS (trimmed, any case) stays."""
    async with pool.acquire() as conn:
        user = await add_user(conn, email="boss@EXAMPLE.com", verified=True)

    await sweep(pool)

    async with pool.acquire() as conn:
        assert await user_ids(conn) == {user}


async def test_an_unverified_user_with_a_superadmin_email_is_deleted(pool: asyncpg.Pool) -> None:
    """An unverified squat of a superadmin address gets no shelter."""
    async with pool.acquire() as conn:
        await add_user(conn, email="ops@example.com", verified=False)

    await sweep(pool)

    async with pool.acquire() as conn:
        assert await user_ids(conn) == set()


async def test_the_operator_is_kept(pool: asyncpg.Pool) -> None:
    """instance_settings.operator_user_id is never an orphan, membership or not."""
    async with pool.acquire() as conn:
        user = await add_user(conn)
        await set_operator(conn, user)

    await sweep(pool)

    async with pool.acquire() as conn:
        assert await user_ids(conn) == {user}


async def test_a_user_younger_than_the_retention_is_kept(pool: asyncpg.Pool) -> None:
    """A user created within ORPHAN_USER_RETENTION_HOURS stays; one just past it goes."""
    async with pool.acquire() as conn:
        young = await add_user(conn, age=23 * HOUR)
        await add_user(conn, age=25 * HOUR)

    await sweep(pool)

    async with pool.acquire() as conn:
        assert await user_ids(conn) == {young}


async def test_a_run_that_deleted_writes_one_instance_audit_row(pool: asyncpg.Pool) -> None:
    """60 orphans go over two batches, and one system row records the count, the retention and
    a sample of 20 of their emails."""
    async with pool.acquire() as conn:
        emails = set()
        for n in range(60):
            emails.add(f"orphan{n}@example.com")
            await add_user(conn, email=f"orphan{n}@example.com")

    await sweep(pool)

    async with pool.acquire() as conn:
        assert await user_ids(conn) == set()
        rows = await orphan_audit_rows(conn)
        details = await conn.fetchval("SELECT details FROM jobs.purge_run")
    assert len(rows) == 1
    row = rows[0]
    assert row["workspace_id"] is None
    assert row["actor_via"] == "system"
    assert row["principal"] is None
    assert row["resource_type"] == "user"
    metadata = json.loads(row["metadata"])
    assert metadata["deleted"] == 60
    assert metadata["retention_hours"] == 24
    assert len(metadata["sample"]) == 20
    assert set(metadata["sample"]) <= emails
    assert json.loads(details)["batches"] == 2


async def test_a_run_that_deleted_nothing_writes_no_audit_row(pool: asyncpg.Pool) -> None:
    """When every user is kept, the sweep leaves the audit log alone."""
    async with pool.acquire() as conn:
        user = await add_user(conn)
        await add_membership(conn, user)

    await sweep(pool)

    async with pool.acquire() as conn:
        assert await orphan_audit_rows(conn) == []


async def _refuse_deletes(conn: asyncpg.Connection, *, only: str | None) -> None:
    await conn.execute(
        """CREATE FUNCTION public.refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
             IF TG_ARGV[0] = '*' OR OLD.id = TG_ARGV[0] THEN
               RAISE EXCEPTION 'last owner of a workspace';
             END IF;
             RETURN OLD;
           END $$"""
    )
    await conn.execute(
        f"""CREATE TRIGGER refuse_delete BEFORE DELETE ON public."user"
            FOR EACH ROW EXECUTE FUNCTION public.refuse_delete('{only or "*"}')"""
    )


async def test_a_failed_delete_skips_that_user_whole_and_the_sweep_goes_on(
    pool: asyncpg.Pool, captured_logs: list[dict[str, object]]
) -> None:
    """A user whose delete raises keeps every row (accounts, sessions) and the others still go."""
    async with pool.acquire() as conn:
        stuck = await add_user(conn)
        await add_account(conn, stuck)
        await add_session(conn, stuck, expires_in=-DAY)
        for _ in range(5):
            await add_user(conn)
        await _refuse_deletes(conn, only=stuck)

    await sweep(pool)

    async with pool.acquire() as conn:
        assert await user_ids(conn) == {stuck}
        assert await count(conn, "account", stuck) == 1
        assert await count(conn, "session", stuck) == 1
        metadata = json.loads((await orphan_audit_rows(conn))[0]["metadata"])
    assert metadata["deleted"] == 5
    skipped = [e for e in captured_logs if e["event"] == "purge.orphan_skipped"]
    assert [e["user_id"] for e in skipped] == [stuck]
    ran = [e for e in captured_logs if e["event"] == "purge.ran"]
    assert ran[0]["skipped"] == 1


async def test_a_batch_without_progress_stops_the_sweep(pool: asyncpg.Pool) -> None:
    """When every delete of a full batch fails, the run stops after that batch, not in a loop."""
    async with pool.acquire() as conn:
        for _ in range(12):
            await add_user(conn)
        await _refuse_deletes(conn, only=None)
    rule = OrphanRule(retention_hours=24, limits=BatchLimits(batch_size=5, max_batches=50))

    run = await run_body(pool, ORPHAN_USER_PURGE_QUEUE, orphan_body(rule))

    assert (run.deleted, run.drained) == (0, False)
    assert run.details["batches"] == 1
    assert run.details["skipped"] == 5
    async with pool.acquire() as conn:
        assert len(await user_ids(conn)) == 12
        assert await orphan_audit_rows(conn) == []


async def test_kept_users_never_fill_a_batch(pool: asyncpg.Pool) -> None:
    """Every kind of protected user is excluded by the candidate query itself, so batches of 5
    reach the 7 orphans created after 24 protected users."""
    async with pool.acquire() as conn:
        for n in range(24):
            # Older than every orphan: first in candidate order, so a skip-in-the-caller design
            # would fill each batch with them.
            user = await add_user(
                conn, email=f"kept{n}@example.com", verified=True, age=30 * DAY + n * HOUR
            )
            kind = n % 6
            if kind == 0:
                await add_membership(conn, user)
            elif kind == 1:
                await add_membership(conn, user, deactivated=True)
            elif kind == 2:
                await add_session(conn, user, expires_in=HOUR)
            elif kind == 3:
                await add_invitation(conn, f"KEPT{n}@example.com")
            elif kind == 4:
                await conn.execute(
                    'UPDATE public."user" SET email = $2 WHERE id = $1', user, f"boss{n}@x.io"
                )
            elif n == 5:
                await set_operator(conn, user)
            else:
                await add_membership(conn, user, workspace="w2")
        for _ in range(7):
            await add_user(conn)
    superadmins = frozenset(f"boss{n}@x.io" for n in range(24))
    rule = OrphanRule(
        retention_hours=24,
        superadmins=superadmins,
        limits=BatchLimits(batch_size=5, max_batches=50),
    )

    run = await run_body(pool, ORPHAN_USER_PURGE_QUEUE, orphan_body(rule))

    assert (run.deleted, run.drained) == (7, True)
    assert run.details["kept_on_recheck"] == 0
    async with pool.acquire() as conn:
        assert len(await user_ids(conn)) == 24


async def test_retention_zero_deletes_nothing(pool: asyncpg.Pool) -> None:
    """With ORPHAN_USER_RETENTION_HOURS=0 a hand-sent job deletes no user."""
    async with pool.acquire() as conn:
        user = await add_user(conn, age=365 * DAY)

    await run_purge_job(pool, make_settings(), ORPHAN_USER_PURGE_QUEUE)

    async with pool.acquire() as conn:
        assert await user_ids(conn) == {user}


async def test_a_role_that_may_not_lock_the_exclusion_tables_fails_the_run_and_deletes_nobody(
    db_url: str, pool: asyncpg.Pool
) -> None:
    """A database role with only SELECT on invitations and instance_settings cannot guard the
    re-check, so the run fails naming the grant it needs, and the orphan stays."""
    async with pool.acquire() as conn:
        user = await add_user(conn)
    role = f"chassis_t_{uuid.uuid4().hex[:12]}"
    await pool.execute(f"CREATE ROLE {role} LOGIN")
    try:
        await pool.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
        await pool.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
        await pool.execute(f'GRANT UPDATE, DELETE ON public."user" TO {role}')
        limited = await asyncpg.create_pool(db_url, user=role, min_size=1, max_size=2)
        try:
            clock = await limited.fetchval("SELECT now()")
            with pytest.raises(ExclusionLockDenied, match=r"public\.invitations"):
                await run_body(
                    limited, ORPHAN_USER_PURGE_QUEUE, orphan_body(OrphanRule(24)), now=clock
                )
        finally:
            await limited.close()
    finally:
        # The role holds grants in this database only: revoke them there, then drop it.
        await pool.execute(f"DROP OWNED BY {role}")
        await pool.execute(f"DROP ROLE {role}")
    async with pool.acquire() as conn:
        assert await user_ids(conn) == {user}
