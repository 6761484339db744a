"""The chassis tables: created in public when absent, an app's own tables kept as they are."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from worker.db.migrations import latest_version, migrate

CHASSIS = {
    "audit_log",
    "api_keys",
    "idempotency_keys",
    "user",
    "session",
    "account",
    "workspace_members",
    "invitations",
    "instance_settings",
}

#: (table, the index's first key) the purges depend on.
PURGE_INDEXES = {
    ("audit_log", "created_at"),
    ("idempotency_keys", "expires_at"),
    ("api_keys", "expires_at"),
    ("session", "user_id"),
    ("account", "user_id"),
    ("workspace_members", "user_id"),
    ("invitations", "lower(email)"),
}

LEADING_KEYS = """
SELECT c.relname AS tbl, pg_get_indexdef(i.indexrelid, 1, true) AS lead
FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
WHERE c.relnamespace = 'public'::regnamespace
"""


async def test_the_migration_creates_every_chassis_table_in_public(pool: asyncpg.Pool) -> None:
    """All nine section-8 tables exist in public, with the indexes the purges need."""
    tables = await pool.fetch(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
    )
    assert {r["table_name"] for r in tables} >= CHASSIS
    leads = {(r["tbl"], r["lead"]) for r in await pool.fetch(LEADING_KEYS)}
    assert leads >= PURGE_INDEXES


async def test_created_at_defaults_to_now(pool: asyncpg.Pool) -> None:
    """Rows written without created_at are stamped with the transaction time."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("INSERT INTO public.\"user\" (id, email) VALUES ('u', 'u@example.com')")
        await conn.execute(
            "INSERT INTO public.audit_log (actor_via, action, resource_type) "
            "VALUES ('user', 'a', 'b')"
        )
        stamps = await conn.fetchrow(
            'SELECT (SELECT created_at FROM public."user") AS u, '
            "(SELECT created_at FROM public.audit_log) AS a, now() AS now"
        )
    assert stamps is not None
    assert stamps["u"] == stamps["a"] == stamps["now"]


async def test_deleting_a_user_cascades_to_sessions_accounts_and_memberships(
    pool: asyncpg.Pool,
) -> None:
    """The foreign keys of session, account and workspace_members are ON DELETE CASCADE."""
    async with pool.acquire() as conn:
        await conn.execute(
            """INSERT INTO public."user" (id, email) VALUES ('u', 'u@example.com');
               INSERT INTO public.session (id, user_id, token, expires_at)
                   VALUES ('s', 'u', 't', now());
               INSERT INTO public.account (id, user_id, provider_id, account_id)
                   VALUES ('a', 'u', 'p', 'x');
               INSERT INTO public.workspace_members (workspace_id, user_id, role)
                   VALUES ('w', 'u', 'owner');
               DELETE FROM public."user" WHERE id = 'u'"""
        )
        left = await conn.fetchval(
            "SELECT (SELECT count(*) FROM public.session) + (SELECT count(*) FROM public.account)"
            " + (SELECT count(*) FROM public.workspace_members)"
        )
    assert left == 0


async def test_an_apps_own_tables_and_indexes_are_kept(empty_db_url: str) -> None:
    """A database that already has "user" and audit_log keeps their shape, and an existing
    audit_log(created_at) index under another name is not duplicated."""
    conn = await asyncpg.connect(empty_db_url)
    try:
        await conn.execute(
            """CREATE TABLE public."user" (
                   id text PRIMARY KEY, email text NOT NULL, email_verified boolean NOT NULL,
                   created_at timestamptz NOT NULL, plan text NOT NULL DEFAULT 'free');
               CREATE TABLE public.audit_log (
                   id bigserial PRIMARY KEY, workspace_id text, actor_via text NOT NULL,
                   principal text, action text NOT NULL, resource_type text NOT NULL,
                   resource_id text, metadata jsonb, created_at timestamptz NOT NULL,
                   ip inet);
               CREATE INDEX audit_log_created_idx ON public.audit_log (created_at);"""
        )

        await migrate(conn, "jobs", lock_timeout=30)

        user_columns = await conn.fetch(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = 'public' AND table_name = 'user'"
        )
        audit_indexes = await conn.fetch(
            "SELECT indexrelid::regclass::text AS name FROM pg_index "
            "WHERE indrelid = 'public.audit_log'::regclass "
            "AND pg_get_indexdef(indexrelid, 1, true) = 'created_at'"
        )
        session_fk = await conn.fetchval(
            "SELECT confrelid::regclass::text FROM pg_constraint "
            "WHERE conrelid = 'public.session'::regclass AND contype = 'f'"
        )
    finally:
        await conn.close()
    assert {r["column_name"] for r in user_columns} == {
        "id",
        "email",
        "email_verified",
        "created_at",
        "plan",
    }
    assert [r["name"] for r in audit_indexes] == ["audit_log_created_idx"]
    assert session_fk == '"user"'


async def test_the_migration_applies_beside_the_queue_schema_of_another_name(
    empty_db_url: str,
) -> None:
    """With JOBS_SCHEMA=bg the chassis tables still land in public and purge_run in bg."""
    conn = await asyncpg.connect(empty_db_url)
    try:
        await migrate(conn, "bg", lock_timeout=30)
        found = await conn.fetch(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_name IN ('audit_log', 'purge_run')"
        )
    finally:
        await conn.close()
    assert {(r["table_schema"], r["table_name"]) for r in found} == {
        ("public", "audit_log"),
        ("bg", "purge_run"),
    }


async def test_two_queue_schemas_can_migrate_one_database_at_once(empty_db_url: str) -> None:
    """Daemons with different JOBS_SCHEMA migrating one database concurrently both succeed."""
    first = await asyncpg.connect(empty_db_url)
    second = await asyncpg.connect(empty_db_url)
    try:
        applied = await asyncio.gather(
            migrate(first, "jobs_a", lock_timeout=30), migrate(second, "jobs_b", lock_timeout=30)
        )
    finally:
        await first.close()
        await second.close()
    assert list(applied) == [list(range(1, latest_version() + 1))] * 2


async def test_an_app_table_owned_by_another_role_is_left_without_a_new_index(
    admin_url: str, empty_db_url: str
) -> None:
    """A worker role that does not own an app's audit_log migrates anyway, leaving that table
    unindexed (only its owner may add the index) and indexing the tables it creates."""
    role = f"chassis_t_{uuid.uuid4().hex[:12]}"
    database = empty_db_url.rsplit("/", 1)[1]
    owner = await asyncpg.connect(empty_db_url)
    try:
        await owner.execute(f"CREATE ROLE {role} LOGIN")
        await owner.execute(f'GRANT CREATE ON DATABASE "{database}" TO {role}')
        await owner.execute(f"GRANT CREATE, USAGE ON SCHEMA public TO {role}")
        await owner.execute(
            "CREATE TABLE public.audit_log (id bigserial PRIMARY KEY, workspace_id text, "
            "actor_via text NOT NULL, principal text, action text NOT NULL, "
            "resource_type text NOT NULL, resource_id text, metadata jsonb, "
            "created_at timestamptz NOT NULL DEFAULT now())"
        )
        worker = await asyncpg.connect(empty_db_url, user=role)
        try:
            await migrate(worker, "jobs", lock_timeout=30)
        finally:
            await worker.close()
        leads = {(r["tbl"], r["lead"]) for r in await owner.fetch(LEADING_KEYS)}
    finally:
        await owner.close()
        # The role owns objects in the test database: drop that first, then the role.
        admin = await asyncpg.connect(admin_url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            await admin.execute(f"DROP ROLE IF EXISTS {role}")
        finally:
            await admin.close()
    assert ("audit_log", "created_at") not in leads
    assert leads >= PURGE_INDEXES - {("audit_log", "created_at")}
