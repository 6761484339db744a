"""Rows of the chassis tables for purge tests, dated relative to the database clock."""

from __future__ import annotations

import uuid
from datetime import timedelta

import asyncpg

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


def new_id(prefix: str) -> str:
    """A unique text id."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


async def add_user(
    conn: asyncpg.Connection,
    user_id: str | None = None,
    *,
    email: str | None = None,
    verified: bool = False,
    age: timedelta = 3 * DAY,
) -> str:
    """Insert a user created ``age`` ago; return its id."""
    user_id = user_id or new_id("u")
    await conn.execute(
        'INSERT INTO public."user" (id, email, email_verified, created_at) '
        "VALUES ($1, $2, $3, now() - $4::interval)",
        user_id,
        email or f"{user_id}@example.com",
        verified,
        age,
    )
    return user_id


async def add_session(conn: asyncpg.Connection, user_id: str, *, expires_in: timedelta) -> str:
    """Insert a session of ``user_id`` expiring ``expires_in`` from now (negative: expired)."""
    session_id = new_id("s")
    await conn.execute(
        "INSERT INTO public.session (id, user_id, token, expires_at) "
        "VALUES ($1, $2, $3, now() + $4::interval)",
        session_id,
        user_id,
        new_id("tok"),
        expires_in,
    )
    return session_id


async def add_account(conn: asyncpg.Connection, user_id: str) -> str:
    """Insert a credential account of ``user_id``."""
    account_id = new_id("a")
    await conn.execute(
        "INSERT INTO public.account (id, user_id, provider_id, account_id) "
        "VALUES ($1, $2, 'credential', $1)",
        account_id,
        user_id,
    )
    return account_id


async def add_membership(
    conn: asyncpg.Connection, user_id: str, *, workspace: str = "w1", deactivated: bool = False
) -> None:
    """Insert a membership of ``user_id`` in ``workspace``, deactivated or not."""
    await conn.execute(
        "INSERT INTO public.workspace_members (workspace_id, user_id, role, deactivated_at) "
        "VALUES ($1, $2, 'member', CASE WHEN $3 THEN now() END)",
        workspace,
        user_id,
        deactivated,
    )


async def add_invitation(
    conn: asyncpg.Connection,
    email: str,
    *,
    expires_in: timedelta = DAY,
    accepted: bool = False,
    revoked: bool = False,
) -> None:
    """Insert an invitation for ``email`` expiring ``expires_in`` from now."""
    await conn.execute(
        "INSERT INTO public.invitations (id, workspace_id, email, expires_at, accepted_at, "
        "revoked_at) VALUES ($1, 'w1', $2, now() + $3::interval, "
        "CASE WHEN $4 THEN now() END, CASE WHEN $5 THEN now() END)",
        new_id("inv"),
        email,
        expires_in,
        accepted,
        revoked,
    )


async def set_operator(conn: asyncpg.Connection, user_id: str | None) -> None:
    """Make ``user_id`` the instance operator."""
    await conn.execute(
        "INSERT INTO public.instance_settings (id, operator_user_id) VALUES (1, $1) "
        "ON CONFLICT (id) DO UPDATE SET operator_user_id = EXCLUDED.operator_user_id",
        user_id,
    )


async def user_ids(conn: asyncpg.Connection) -> set[str]:
    """Ids of every user left."""
    return {r["id"] for r in await conn.fetch('SELECT id FROM public."user"')}


async def count(conn: asyncpg.Connection, table: str, user_id: str) -> int:
    """Rows of ``public.<table>`` that belong to ``user_id``."""
    value: int = await conn.fetchval(
        f"SELECT count(*) FROM public.{table} WHERE user_id = $1", user_id
    )
    return value


async def add_audit_rows(conn: asyncpg.Connection, n: int, *, age: timedelta) -> None:
    """Insert ``n`` audit rows created ``age`` ago, one second apart going back."""
    await conn.execute(
        "INSERT INTO public.audit_log (workspace_id, actor_via, action, resource_type, "
        "created_at) SELECT 'w1', 'user', 'thing.read', 'thing', "
        "now() - $2::interval - g * interval '1 second' FROM generate_series(1, $1) g",
        n,
        age,
    )


async def orphan_audit_rows(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    """The audit rows the orphan purge wrote."""
    rows: list[asyncpg.Record] = await conn.fetch(
        "SELECT * FROM public.audit_log WHERE action = 'user.orphan_purge' ORDER BY id"
    )
    return rows
