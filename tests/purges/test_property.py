"""orphan-user-purge over random small graphs of users, memberships, sessions and invitations."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import asyncpg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.jobs.purges import ORPHAN_USER_PURGE_QUEUE
from worker.jobs.purges.orphan_users import OrphanRule, orphan_body

from .chassis import DAY, HOUR, add_invitation, add_membership, add_session, orphan_audit_rows
from .chassis import add_user as insert_user
from .chassis import set_operator as store_operator
from .runner import make_settings, run_body

ADDRESSES = ["ann@example.com", "bob@example.com", "cy@example.com", "dee@example.com"]
#: One address in several letter cases (so invitations and the allowlist must match loosely), or a
#: near miss that must not match.
spelled = st.sampled_from(ADDRESSES).flatmap(
    lambda a: st.sampled_from([a, a.upper(), a.capitalize(), a.replace("@", "@EX").lower()])
)


@dataclass(frozen=True)
class User:
    """One generated user and what holds on to it."""

    email: str
    verified: bool
    old: bool
    membership: str | None  # None, "active" or "deactivated"
    sessions: tuple[bool, ...]  # live or not, one per session


@dataclass(frozen=True)
class Invitation:
    """One generated invitation."""

    email: str
    state: str  # "live", "expired", "accepted" or "revoked"


users_st = st.lists(
    st.builds(
        User,
        email=spelled,
        verified=st.booleans(),
        # Weighted towards candidates, so each single protection is often the only one.
        old=st.sampled_from([True, True, True, False]),
        membership=st.sampled_from([None, None, None, "active", "deactivated"]),
        sessions=st.lists(st.booleans(), max_size=2).map(tuple),
    ),
    max_size=7,
    unique_by=lambda u: u.email,
)
invitations_st = st.lists(
    st.builds(
        Invitation, email=spelled, state=st.sampled_from(["live", "expired", "accepted", "revoked"])
    ),
    max_size=4,
)
# How SUPERADMIN_EMAILS might be written: any case, stray spaces.
allowlist_st = st.lists(
    st.sampled_from(ADDRESSES).map(lambda a: f"  {a.upper()} "), max_size=3
).map(",".join)


def protected(
    user: User, user_id: str, invitations: list[Invitation], superadmins: frozenset[str], op: str
) -> bool:
    """The contract's rule, written independently of the SQL: whether the sweep must keep it."""
    return (
        not user.old
        or user.membership is not None
        or any(user.sessions)
        or any(i.state == "live" and i.email.lower() == user.email.lower() for i in invitations)
        or (user.verified and user.email.strip().lower() in superadmins)
        or user_id == op
    )


async def _reset(conn: asyncpg.Connection) -> None:
    await conn.execute(
        'TRUNCATE public."user", public.invitations, public.instance_settings, public.audit_log '
        "CASCADE"
    )


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    users=users_st,
    invitations=invitations_st,
    allowlist=allowlist_st,
    operator=st.none() | st.integers(min_value=0, max_value=6),
)
async def test_a_sweep_keeps_exactly_the_protected_users(
    pool: asyncpg.Pool,
    users: list[User],
    invitations: list[Invitation],
    allowlist: str,
    operator: int | None,
) -> None:
    """After a sweep no user with a membership, a live session, a live invitation, a verified
    superadmin email or the operator id is gone, and every other old user is."""
    superadmins = make_settings(superadmin_emails=allowlist).superadmins
    ids = [f"u{n}" for n in range(len(users))]
    op = ids[operator] if operator is not None and operator < len(ids) else ""
    async with pool.acquire() as conn:
        await _reset(conn)
        for user_id, user in zip(ids, users, strict=True):
            age = 2 * DAY if user.old else timedelta(minutes=10)
            await insert_user(conn, user_id, email=user.email, verified=user.verified, age=age)
            if user.membership:
                await add_membership(conn, user_id, deactivated=user.membership == "deactivated")
            for live in user.sessions:
                await add_session(conn, user_id, expires_in=HOUR if live else -HOUR)
        for inv in invitations:
            await add_invitation(
                conn,
                inv.email,
                expires_in=-HOUR if inv.state == "expired" else DAY,
                accepted=inv.state == "accepted",
                revoked=inv.state == "revoked",
            )
        if op:
            await store_operator(conn, op)
    rule = OrphanRule(retention_hours=24, superadmins=superadmins)

    run = await run_body(pool, ORPHAN_USER_PURGE_QUEUE, orphan_body(rule))

    expected = {
        user_id
        for user_id, user in zip(ids, users, strict=True)
        if protected(user, user_id, invitations, superadmins, op)
    }
    async with pool.acquire() as conn:
        left = {r["id"] for r in await conn.fetch('SELECT id FROM public."user"')}
        audit_rows = len(await orphan_audit_rows(conn))
    assert left == expected
    assert run.deleted == len(users) - len(expected)
    assert audit_rows == (1 if run.deleted else 0)
