"""config/roles.sql on a real PostgreSQL: an enqueue-only api role, an installing worker role."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest

from api_sender import Actor, PermissionDenied, Sender, UsageEvent
from tests.support.counts import reported_counts
from tests.support.postgres import create_database, drop_database, with_database
from tests.support.processes import Daemon, run_cli, start_daemon
from tests.support.queues import make_queue
from tests.support.roles import (
    COLUMN_PRIVILEGES,
    Rights,
    Roles,
    apply_roles,
    as_role,
    fresh_roles,
    refused,
    rights_of,
)
from worker.db.migrations import applied_versions, latest_version, migrate
from worker.install import grant_api_role, install
from worker.jobs.usage.operator import HeldStore, Selection

pytestmark = [
    pytest.mark.skipif(shutil.which("psql") is None, reason="psql (postgresql-client) needed"),
]

TOKEN = "roles-test-token"
#: The chassis tables of contract section 8 (in public).
CHASSIS_TABLES = (
    "user",
    "session",
    "account",
    "workspace_members",
    "invitations",
    "instance_settings",
    "audit_log",
    "api_keys",
    "idempotency_keys",
)


@pytest.fixture
async def roles(admin_url: str) -> AsyncIterator[Roles]:
    """Fresh role names; the roles are dropped after the test's databases are gone."""
    async with fresh_roles(admin_url, "t") as names:
        yield names


@pytest.fixture
async def migrated_db(roles: Roles, admin_url: str, template_name: str) -> AsyncIterator[str]:
    """A database migrated by the superuser (before any role existed); dropped before the roles."""
    name = await create_database(admin_url, template_name)
    try:
        yield with_database(admin_url, name)
    finally:
        await drop_database(admin_url, name)


@pytest.fixture
async def fresh_db(roles: Roles, admin_url: str) -> AsyncIterator[str]:
    """An empty database; dropped before the roles."""
    name = await create_database(admin_url, None)
    try:
        yield with_database(admin_url, name)
    finally:
        await drop_database(admin_url, name)


def post(daemon: Daemon, path: str, body: Any, token: str | None = TOKEN) -> tuple[int, Any]:
    """POST JSON to the daemon; (status, decoded body)."""
    request = urllib.request.Request(
        daemon.url(path), data=json.dumps(body).encode(), method="POST"
    )
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def owners(conn: asyncpg.Connection, schema: str) -> set[str]:
    """Every owner of the schema and of every relation, type and routine in it."""
    rows = await conn.fetch(
        """
        SELECT pg_get_userbyid(nspowner) AS owner FROM pg_namespace WHERE nspname = $1
        UNION SELECT pg_get_userbyid(relowner) FROM pg_class
              WHERE relnamespace = $1::regnamespace
        UNION SELECT pg_get_userbyid(typowner) FROM pg_type
              WHERE typnamespace = $1::regnamespace
        UNION SELECT pg_get_userbyid(proowner) FROM pg_proc
              WHERE pronamespace = $1::regnamespace
        """,
        schema,
    )
    return {row["owner"] for row in rows}


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
async def test_api_role_ingests_and_enqueues_but_cannot_delete_or_create(
    migrated_db: str, admin_url: str, roles: Roles, tmp_path
) -> None:
    """On a database a superuser migrated, roles.sql hands the queue schema to the worker role,
    the worker role installs, and the api role boots ready, ingests over HTTP and enqueues
    through api_sender, yet cannot CREATE, DELETE, TRUNCATE or DROP."""
    dbname = urlsplit(migrated_db).path.lstrip("/")
    # Connected to the maintenance database: roles.sql reconnects to -v dbname itself.
    apply_roles(admin_url, roles, dbname=dbname)
    admin = await asyncpg.connect(migrated_db)
    try:
        assert await owners(admin, "jobs") == {roles.worker}
    finally:
        await admin.close()

    worker_url, api_url = as_role(migrated_db, roles.worker), as_role(migrated_db, roles.api)
    done = await asyncio.to_thread(run_cli, worker_url, "migrate", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    daemon = start_daemon(api_url, tmp_path, role="api", name="api", env={"INGEST_TOKEN": TOKEN})
    try:
        await asyncio.to_thread(daemon.wait_ready, 30)
        event = {
            "meter": "api.calls",
            "quantity": 3,
            "occurred_at": "2026-01-01T00:00:00+00:00",
            "workspace_id": "w1",
        }
        status, body = await asyncio.to_thread(post, daemon, "/v1/usage-events", event)
        assert status == 202, body
        assert body["accepted"] == 1
        status, body = await asyncio.to_thread(
            post, daemon, "/v1/jobs/audit-purge", {"data": {"from": "http"}}
        )
        assert status == 202, body

        async with Sender.connect(api_url, max_size=2) as sender:
            sent = await sender.send("audit-purge", {"from": "sender"})
            many = await sender.send_many("audit-purge", [{"n": 1}, {"n": 2}])
            timer = await sender.timers.schedule("audit-purge", delay_seconds=3600, key="t")
            assert await sender.timers.cancel("audit-purge", "t") is True
            emitted = await sender.usage.emit(UsageEvent("api.calls", 1, "w1"))
        assert sent is not None
        assert len(many) == 2
        assert timer
        assert emitted is not None

        api = await asyncpg.connect(api_url)
        try:
            # The timer cancel went through the counting trigger as the api role, and the api
            # role reads the counts (its /metrics does too, below).
            assert (await reported_counts(api))[("audit-purge", "cancelled")] == 1
            assert await refused(api, "DELETE FROM jobs.job_count")
            assert await refused(api, "CREATE TABLE jobs.intruder (id int)")
            assert await refused(api, "CREATE SCHEMA intruder")
            assert await refused(api, "DELETE FROM jobs.job")
            assert await refused(api, "TRUNCATE jobs.job")
            assert await refused(api, "DROP TABLE jobs.job")
            assert await refused(api, "ALTER TABLE jobs.job ADD COLUMN x int")
            assert await refused(api, "SELECT count(*) FROM public.audit_log")
            assert await api.fetchval("SELECT has_schema_privilege('jobs', 'CREATE')") is False
        finally:
            await api.close()

        admin = await asyncpg.connect(migrated_db)
        try:
            counts = dict(await admin.fetch("SELECT queue, count(*) FROM jobs.job GROUP BY queue"))
            assert counts == {"usage-events": 2, "audit-purge": 5}
            for table in CHASSIS_TABLES:
                granted = await admin.fetchval(
                    "SELECT has_table_privilege($1, format('public.%I', $2::text), "
                    "'SELECT, INSERT, UPDATE, DELETE')",
                    roles.worker,
                    table,
                )
                assert granted is True, table
        finally:
            await admin.close()
        cancelled = 'queue_jobs{queue="audit-purge",state="cancelled"} 1.0'
        for _ in range(40):  # a count slower than a scrape's budget shows on a later scrape
            status, text = await asyncio.to_thread(daemon.get, "/metrics")
            assert status == 200
            if cancelled in text:
                break
            await asyncio.sleep(0.25)
        assert cancelled in text
        assert daemon.stop() == 0, daemon.logs()
    finally:
        daemon.kill()

    # The worker role does the purges' work on superuser-owned chassis tables.
    worker = await asyncpg.connect(worker_url)
    try:
        await worker.execute(
            "INSERT INTO public.audit_log (actor_via, action, resource_type, created_at) "
            "VALUES ('test', 'x', 'y', now() - interval '400 days')"
        )
        assert await worker.execute("DELETE FROM public.audit_log") == "DELETE 1"
    finally:
        await worker.close()


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
async def test_worker_role_installs_an_empty_database_then_api_role_ingests(
    fresh_db: str, roles: Roles, tmp_path
) -> None:
    """With roles.sql applied to an empty database (custom JOBS_SCHEMA), a worker booted as the
    worker role installs everything it owns, and an api booted as the api role ingests into the
    tables created after roles.sql ran."""
    schema = "chassis_q"
    apply_roles(fresh_db, roles, jobs_schema=schema)
    env = {"JOBS_SCHEMA": schema}
    worker = start_daemon(as_role(fresh_db, roles.worker), tmp_path, role="worker", env=env)
    daemons = [worker]
    try:
        await asyncio.to_thread(worker.wait_ready, 30)
        api = start_daemon(
            as_role(fresh_db, roles.api),
            tmp_path,
            role="api",
            name="api",
            env={**env, "INGEST_TOKEN": TOKEN},
        )
        daemons.append(api)
        await asyncio.to_thread(api.wait_ready, 30)
        event = {
            "meter": "api.calls",
            "quantity": 1,
            "occurred_at": "2026-01-01T00:00:00Z",
            "workspace_id": "w1",
        }
        status, body = await asyncio.to_thread(post, api, "/v1/usage-events", {"events": [event]})
        assert status == 202, body

        admin = await asyncpg.connect(fresh_db)
        try:
            assert await owners(admin, schema) == {roles.worker}
            queues = {r["name"] for r in await admin.fetch(f"SELECT name FROM {schema}.queue")}
            assert {"usage-events", "usage-events-held", "audit-purge"} <= queues
            table_owners = {
                r["tableowner"]
                for r in await admin.fetch(
                    "SELECT tableowner FROM pg_tables WHERE schemaname = 'public' "
                    "AND tablename = ANY($1::text[])",
                    list(CHASSIS_TABLES),
                )
            }
            assert table_owners == {roles.worker}
        finally:
            await admin.close()
        for daemon in daemons:
            assert daemon.stop() == 0, daemon.logs()
    finally:
        for daemon in daemons:
            daemon.kill()


@pytest.mark.slow
async def test_roles_sql_hands_every_object_in_the_queue_schema_to_the_worker_role(
    migrated_db: str, roles: Roles
) -> None:
    """Views, free sequences, domains, composite types and functions a superuser left in the
    queue schema all belong to the worker role after roles.sql."""
    admin = await asyncpg.connect(migrated_db)
    try:
        await admin.execute(
            """
            CREATE VIEW jobs.waiting AS SELECT id FROM jobs.job WHERE state = 'created';
            CREATE SEQUENCE jobs.loose_seq;
            CREATE DOMAIN jobs.positive AS integer CHECK (VALUE > 0);
            CREATE TYPE jobs.pair AS (a int, b int);
            CREATE FUNCTION jobs.one() RETURNS int LANGUAGE sql AS 'SELECT 1';
            """
        )
        superuser = await admin.fetchval("SELECT current_user")
        assert await owners(admin, "jobs") == {superuser}
        apply_roles(migrated_db, roles)
        assert await owners(admin, "jobs") == {roles.worker}
    finally:
        await admin.close()


ACL_SNAPSHOT = """
SELECT json_build_object(
  'roles', (SELECT json_agg(json_build_object('name', rolname, 'super', rolsuper,
            'createdb', rolcreatedb, 'createrole', rolcreaterole, 'login', rolcanlogin,
            'replication', rolreplication, 'bypassrls', rolbypassrls,
            'password', rolpassword) ORDER BY rolname)
            FROM pg_authid WHERE rolname = ANY($1::text[])),
  'database', (SELECT datacl::text FROM pg_database WHERE datname = current_database()),
  'schemas', (SELECT json_agg(json_build_object(nspname, nspacl::text,
              'owner', pg_get_userbyid(nspowner)) ORDER BY nspname)
              FROM pg_namespace WHERE nspname IN ('jobs', 'public')),
  'tables', (SELECT json_agg(json_build_object(relname, relacl::text,
             'owner', pg_get_userbyid(relowner)) ORDER BY relname)
             FROM pg_class WHERE relnamespace IN ('jobs'::regnamespace, 'public'::regnamespace)),
  'defaults', (SELECT json_agg(defaclacl::text ORDER BY defaclobjtype) FROM pg_default_acl)
)::text
"""


@pytest.mark.slow
async def test_roles_sql_is_idempotent_and_grants_no_special_powers(
    migrated_db: str, roles: Roles
) -> None:
    """A second run of roles.sql (without passwords) changes nothing, keeps the passwords, and
    both roles are plain login roles."""
    apply_roles(migrated_db, roles)
    admin = await asyncpg.connect(migrated_db)
    try:
        first = await admin.fetchval(ACL_SNAPSHOT, [roles.api, roles.worker])
        apply_roles(migrated_db, roles, passwords=False)
        second = await admin.fetchval(ACL_SNAPSHOT, [roles.api, roles.worker])
        assert json.loads(second) == json.loads(first)
        for role in json.loads(first)["roles"]:
            assert role["login"] is True
            assert role["password"] is not None
            for power in ("super", "createdb", "createrole", "replication", "bypassrls"):
                assert role[power] is False, (role["name"], power)
    finally:
        await admin.close()


ADMIN = "roles-admin-token"


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
async def test_api_role_acts_with_audit_but_cannot_delete_or_purge(
    migrated_db: str,
    admin_url: str,
    roles: Roles,
    tmp_path,
) -> None:
    """Through api_sender as the api role: retry, cancel, resume and pause work and write their
    audit rows; delete and purge raise PermissionDenied and change nothing; over HTTP on an api
    process the same delete is 403 naming DELETE."""
    dbname = urlsplit(migrated_db).path.lstrip("/")
    apply_roles(admin_url, roles, dbname=dbname)
    worker_url, api_url = as_role(migrated_db, roles.worker), as_role(migrated_db, roles.api)
    assert (await asyncio.to_thread(run_cli, worker_url, "migrate", cwd=tmp_path)).returncode == 0
    admin = await asyncpg.create_pool(migrated_db, min_size=1, max_size=1)
    try:
        await make_queue(admin, "reports")
    finally:
        await admin.close()
    async with Sender.connect(api_url, max_size=2) as sender:
        ids = await sender.send_many("reports", [{}, {}, {}])
        assert await sender.jobs.cancel(ids) == ids
        assert await sender.jobs.resume(ids[:1]) == ids[:1]
        assert await sender.jobs.retry(ids[1:2]) == ids[1:2]
        assert await sender.queues.pause("reports") is True
        with pytest.raises(PermissionDenied, match="DELETE"):
            await sender.jobs.delete(ids)
        with pytest.raises(PermissionDenied, match="DELETE"):
            await sender.queues.purge("reports")
        assert len((await sender.jobs.list(queue="reports")).jobs) == 3
    check = await asyncpg.connect(migrated_db)
    try:
        actions = [
            r["action"]
            for r in await check.fetch("SELECT action FROM public.audit_log ORDER BY id")
        ]
    finally:
        await check.close()
    assert actions == ["job.cancel", "job.resume", "job.retry", "queue.pause"]
    daemon = start_daemon(api_url, tmp_path, role="api", name="api", env={"ADMIN_TOKEN": ADMIN})
    try:
        await asyncio.to_thread(daemon.wait_ready, 30)
        response = await asyncio.to_thread(
            httpx.post,
            daemon.url("/v1/admin/jobs/delete"),
            json={"ids": ids},
            headers={"Authorization": f"Bearer {ADMIN}"},
        )
        assert response.status_code == 403, response.text
        assert "DELETE" in response.json()["error"]
        assert daemon.stop() == 0
    finally:
        daemon.kill()


# --- Exactly what the api role may do (issue 28) ---------------------------------------------


def expect(kind: str, columns: str, table: str = "", **extra: str) -> Rights:
    """The api role's rights on one relation: ``table`` on the whole of it (so, for SELECT,
    INSERT, UPDATE and REFERENCES, on every one of ``columns``), and ``extra`` on single
    columns (``column="INSERT UPDATE"``). Every column must be named."""
    names = columns.split()
    assert set(extra) <= set(names), set(extra) - set(names)
    whole = frozenset(table.split())
    on_columns = whole & frozenset(COLUMN_PRIVILEGES)
    return Rights(kind, whole, {c: on_columns | frozenset(extra.get(c, "").split()) for c in names})


#: The columns a send writes (migrations 0007/0008: send, send_many, schedule_timer), besides
#: start_after and retry_limit, which the actions update too.
SENT = "queue policy data priority singleton_key is_timer retry_delay retry_backoff expire_seconds"
#: The columns an action's audit row fills (api_sender/job_queries.py, the held tools).
AUDITED = "workspace_id actor_via principal action resource_type resource_id metadata"


def api_rights(schema: str) -> dict[tuple[str, str], Rights]:
    """The decision for every relation of the queue schema and of public: what the api role
    may do there, and nothing else. A relation or column missing here fails the tests below,
    so a table added later needs a decision (here and in config/roles.sql)."""
    sent = dict.fromkeys(SENT.split(), "INSERT")
    return {
        # Sends read a queue's policy and retry defaults; pause and resume write the flag.
        (schema, "queue"): expect(
            "r",
            "name policy retry_limit retry_delay retry_backoff expire_seconds retention_seconds "
            "failed_retention_seconds dead_letter created_at updated_at paused",
            "SELECT",
            paused="UPDATE",
            updated_at="UPDATE",
        ),
        # Sends insert waiting jobs (state, attempt, locked_by and the times take their
        # defaults); cancel, resume, retry, timer replace and the held redrive and discard
        # update a job's state, times, fence, retry limit and output; the admin API reads all.
        (schema, "job"): expect(
            "r",
            "id queue policy state priority data singleton_key is_timer retry_limit retry_count "
            "retry_delay retry_backoff expire_seconds start_after created_at started_at "
            "completed_at locked_by attempt output",
            "SELECT",
            **sent,
            retry_limit="INSERT UPDATE",
            start_after="INSERT UPDATE",
            state="UPDATE",
            started_at="UPDATE",
            completed_at="UPDATE",
            locked_by="UPDATE",
            output="UPDATE",
        ),
        # The counting triggers of 0005 run as the role that updates job.
        (schema, "job_count"): expect("r", "queue state n", "SELECT INSERT", n="UPDATE"),
        # The console tallies the chart's minutes when no worker has lately.
        (schema, "job_minute"): expect(
            "r", "minute completed failed", "SELECT INSERT", completed="UPDATE", failed="UPDATE"
        ),
        # The queues document shows each purge queue's last run.
        (schema, "purge_run"): expect(
            "r", "id queue job_id started_at finished_at deleted drained details", "SELECT"
        ),
        # Readiness and the queues document read these views, not the tables behind them.
        (schema, "install_state"): expect("v", "version installed_at", "SELECT"),
        (schema, "queue_schedule"): expect("v", "queue cron last_run", "SELECT"),
        (schema, "schedule"): expect(
            "r", "queue cron tz data last_slot last_run created_at updated_at"
        ),
        (schema, "install"): expect("r", "id completed_at version"),
        (schema, "schema_migration"): expect("r", "version name applied_at"),
        (schema, "worker"): expect("r", "id host pid started_at heartbeat_at"),
        # Identity columns draw from their sequence without any right on it.
        (schema, "job_id_seq"): expect("S", ""),
        (schema, "purge_run_id_seq"): expect("S", ""),
        # Every job and queue action writes its audit row; the role can neither read nor
        # backdate (created_at) nor number (id) one.
        ("public", "audit_log"): expect(
            "r",
            "id workspace_id actor_via principal action resource_type resource_id metadata "
            "created_at",
            **dict.fromkeys(AUDITED.split(), "INSERT"),
        ),
        ("public", "audit_log_id_seq"): expect("S", ""),
        ("public", "user"): expect("r", "id email email_verified name created_at updated_at"),
        ("public", "session"): expect(
            "r", "id user_id token expires_at ip_address user_agent created_at updated_at"
        ),
        ("public", "account"): expect(
            "r", "id user_id provider_id account_id created_at updated_at"
        ),
        ("public", "workspace_members"): expect(
            "r", "workspace_id user_id role origin deactivated_at created_at"
        ),
        ("public", "invitations"): expect(
            "r", "id workspace_id email role expires_at accepted_at revoked_at created_at"
        ),
        ("public", "instance_settings"): expect("r", "id operator_user_id updated_at"),
        ("public", "api_keys"): expect(
            "r", "id workspace_id name key_hash expires_at revoked_at last_used_at created_at"
        ),
        ("public", "idempotency_keys"): expect(
            "r", "workspace_id key response created_at expires_at"
        ),
    }


#: roles.sql's grant function in the queue schema: the install runs it, the api role may not.
GRANT_FUNCTION = "grant_api_role"


async def assert_api_rights_are_exactly_the_decided(
    conn: asyncpg.Connection, api: str, schema: str = "jobs"
) -> None:
    """Walk the catalog: every relation and column of the queue schema and of public against
    :func:`api_rights`, then the schemas, the database and the functions."""
    actual = await rights_of(conn, api, (schema, "public"))
    expected = api_rights(schema)
    wrong = [f"{key}: no decision in api_rights()" for key in sorted(set(actual) - set(expected))]
    wrong += [f"{key}: not in the catalog" for key in sorted(set(expected) - set(actual))]
    for key in sorted(set(expected) & set(actual)):
        want, got = expected[key], actual[key]
        if (got.kind, got.table) != (want.kind, want.table):
            wrong.append(f"{key}: {sorted(got.table)} on the whole, expected {sorted(want.table)}")
        for column in sorted(set(got.columns) - set(want.columns)):
            wrong.append(f"{key}.{column}: no decision in api_rights()")
        for column, privileges in want.columns.items():
            if got.columns.get(column) != privileges:
                wrong.append(
                    f"{key}.{column}: {sorted(got.columns.get(column, ()))}, "
                    f"expected {sorted(privileges)}"
                )
    assert wrong == [], "\n".join(wrong)
    row = await conn.fetchrow(
        "SELECT has_schema_privilege($1, $2, 'USAGE') AS queue_usage,"
        " has_schema_privilege($1, $2, 'CREATE') AS queue_create,"
        " has_schema_privilege($1, 'public', 'CREATE') AS public_create,"
        " has_database_privilege($1, current_database(), 'CONNECT') AS connect,"
        " has_database_privilege($1, current_database(), 'CREATE') AS create_schema",
        api,
        schema,
    )
    assert dict(row) == {
        "queue_usage": True,
        "queue_create": False,
        "public_create": False,
        "connect": True,
        "create_schema": False,
    }
    functions = {
        r["name"]: (r["proname"], r["execute"], r["definer"])
        for r in await conn.fetch(
            "SELECT p.oid::regprocedure::text AS name, p.proname,"
            " has_function_privilege($1, p.oid, 'EXECUTE') AS execute, p.prosecdef AS definer"
            " FROM pg_proc p WHERE p.pronamespace = $2::regnamespace",
            api,
            schema,
        )
    }
    assert functions
    for name, (proname, execute, definer) in functions.items():
        assert definer is False, f"{name} is SECURITY DEFINER: it needs a decision here"
        assert execute is (proname != GRANT_FUNCTION), name
    # No default privilege hands the api role what a later install creates.
    defaults = await conn.fetchval(
        "SELECT count(*) FROM pg_default_acl d, aclexplode(d.defaclacl) a"
        " WHERE a.grantee = $1::regrole",
        api,
    )
    assert defaults == 0


@pytest.mark.slow
async def test_api_role_has_exactly_the_decided_rights_on_a_migrated_database(
    migrated_db: str, roles: Roles
) -> None:
    """After roles.sql on a database a superuser migrated, the api role's privileges on every
    table, view, sequence and column of the queue schema and of public are exactly the
    decided ones, and it may execute the enqueue functions."""
    apply_roles(migrated_db, roles)
    admin = await asyncpg.connect(migrated_db)
    try:
        await assert_api_rights_are_exactly_the_decided(admin, roles.api)
    finally:
        await admin.close()


@pytest.mark.slow
async def test_the_install_grants_what_roles_sql_decided_on_tables_made_after_it(
    fresh_db: str, roles: Roles
) -> None:
    """With roles.sql run on an empty database (custom JOBS_SCHEMA) and the install run
    afterwards as the worker role, the api role holds exactly the decided rights on the tables
    the install created, with no default privileges behind them."""
    schema = "chassis_q"
    apply_roles(fresh_db, roles, jobs_schema=schema)
    await install(as_role(fresh_db, roles.worker), schema, [], cron_tz="UTC", lock_timeout=30)
    admin = await asyncpg.connect(fresh_db)
    try:
        await assert_api_rights_are_exactly_the_decided(admin, roles.api, schema)
    finally:
        await admin.close()


@pytest.mark.slow
async def test_roles_sql_takes_back_what_older_releases_granted_the_api_role(
    migrated_db: str, roles: Roles
) -> None:
    """A database set up by an older roles.sql (SELECT, INSERT and UPDATE on every queue table
    and sequence, current and future) keeps only the decided rights after a re-run."""
    apply_roles(migrated_db, roles)
    admin = await asyncpg.connect(migrated_db)
    try:
        api, worker = roles.api, roles.worker
        await admin.execute(
            f"""
            GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA jobs TO "{api}";
            GRANT USAGE ON ALL SEQUENCES IN SCHEMA jobs TO "{api}";
            GRANT INSERT ON public.audit_log TO "{api}";
            GRANT USAGE ON SEQUENCE public.audit_log_id_seq TO "{api}";
            ALTER DEFAULT PRIVILEGES FOR ROLE "{worker}" IN SCHEMA jobs
                GRANT SELECT, INSERT, UPDATE ON TABLES TO "{api}";
            ALTER DEFAULT PRIVILEGES FOR ROLE "{worker}" IN SCHEMA jobs
                GRANT USAGE ON SEQUENCES TO "{api}";
            ALTER DEFAULT PRIVILEGES FOR ROLE "{worker}" IN SCHEMA jobs
                GRANT EXECUTE ON FUNCTIONS TO "{api}";
            """
        )
        apply_roles(migrated_db, roles, passwords=False)
        await assert_api_rights_are_exactly_the_decided(admin, api)
    finally:
        await admin.close()


@pytest.mark.slow
async def test_a_table_a_later_migration_adds_gets_nothing_until_roles_sql_decides(
    migrated_db: str, roles: Roles
) -> None:
    """A table the worker role adds to the queue schema after roles.sql ran (as a later
    migration would) gets no right for the api role when the install applies the grants, and
    the install warns that roles.sql has no decision for it."""
    apply_roles(migrated_db, roles)
    worker = await asyncpg.connect(as_role(migrated_db, roles.worker))
    warnings: list[str] = []
    worker.add_log_listener(lambda _conn, message: warnings.append(message.message))
    try:
        await worker.execute("CREATE TABLE jobs.later (id int, note text)")
        await grant_api_role(worker, "jobs")
        granted = await worker.fetchval(
            "SELECT has_any_column_privilege($1, 'jobs.later', 'SELECT, INSERT, UPDATE')"
            " OR has_table_privilege($1, 'jobs.later', 'DELETE, TRUNCATE, REFERENCES, TRIGGER')",
            roles.api,
        )
    finally:
        await worker.close()
    assert granted is False
    assert any("no decision for jobs.later" in w for w in warnings), warnings


@pytest.fixture
async def api_conn(migrated_db: str, roles: Roles) -> AsyncIterator[asyncpg.Connection]:
    """A connection as the api role to a migrated database with roles.sql applied, the usage
    queues installed (usage-events dead-lettering to usage-events-held) and audit-purge on a
    cron."""
    apply_roles(migrated_db, roles)
    admin = await asyncpg.create_pool(migrated_db, min_size=1, max_size=1)
    try:
        await make_queue(admin, "usage-events-held")
        await make_queue(
            admin,
            "usage-events",
            retry_limit=10,
            retry_backoff=True,
            dead_letter="usage-events-held",
        )
        await make_queue(admin, "audit-purge", cron="0 3 * * *")
    finally:
        await admin.close()
    conn = await asyncpg.connect(as_role(migrated_db, roles.api))
    try:
        yield conn
    finally:
        await conn.close()


async def test_api_role_cannot_record_a_migration(
    api_conn: asyncpg.Connection, migrated_db: str, roles: Roles
) -> None:
    """The api role's INSERT of a migration record is refused (insufficient_privilege), so the
    next migrate, which refuses a database with migrations it does not know, still runs."""
    record = "INSERT INTO jobs.schema_migration VALUES (99, 'x')"
    assert await refused(api_conn, record), "the api role recorded migration 0099"
    assert await refused(api_conn, "UPDATE jobs.schema_migration SET name = 'x'")
    assert await refused(api_conn, "SELECT * FROM jobs.schema_migration")
    assert await refused(api_conn, "UPDATE jobs.install SET version = 'x'")
    worker = await asyncpg.connect(as_role(migrated_db, roles.worker))
    try:
        assert await migrate(worker, "jobs", lock_timeout=30) == []
        assert max(await applied_versions(worker, "jobs") or {0: ""}) == latest_version()
    finally:
        await worker.close()


async def test_api_role_cannot_rewrite_a_schedule(api_conn: asyncpg.Connection) -> None:
    """UPDATE, INSERT and SELECT on the schedule table are refused to the api role
    (insufficient_privilege); it reads a queue's cron through the queue_schedule view only."""
    rewrite = "UPDATE jobs.schedule SET cron = '* * * * *'"
    assert await refused(api_conn, rewrite), "the api role rewrote a cron"
    assert await refused(
        api_conn, "INSERT INTO jobs.schedule (queue, cron) VALUES ('usage-events', '* * * * *')"
    )
    assert await refused(api_conn, "SELECT cron FROM jobs.schedule")
    assert await refused(api_conn, "UPDATE jobs.worker SET heartbeat_at = now()")
    shown = await api_conn.fetch("SELECT queue, cron FROM jobs.queue_schedule")
    assert [tuple(r) for r in shown] == [("audit-purge", "0 3 * * *")]


async def test_api_role_cannot_drop_usage_events_by_rewriting_the_queue(
    api_conn: asyncpg.Connection, migrated_db: str
) -> None:
    """Taking the usage queue's dead letter and retries away is refused to the api role
    (insufficient_privilege), as is every other policy column and inserting a queue; pausing
    it, which the queue actions do, is allowed."""
    attack = "UPDATE jobs.queue SET dead_letter = NULL, retry_limit = 0 WHERE name = 'usage-events'"
    assert await refused(api_conn, attack), "the api role took usage-events' dead letter away"
    for column, value in [
        ("dead_letter", "NULL"),
        ("retry_limit", "0"),
        ("retry_delay", "0"),
        ("retry_backoff", "false"),
        ("policy", "'short'"),
        ("expire_seconds", "1"),
        ("retention_seconds", "0"),
        ("failed_retention_seconds", "0"),
        ("name", "'x'"),
    ]:
        assert await refused(
            api_conn, f"UPDATE jobs.queue SET {column} = {value} WHERE name = 'usage-events'"
        ), column
    assert await refused(api_conn, "INSERT INTO jobs.queue (name) VALUES ('intruder')")
    assert await refused(api_conn, "DELETE FROM jobs.queue WHERE name = 'usage-events'")
    # Nor can a job be inserted past the send's columns (a finished one, or a claimed one).
    assert await refused(
        api_conn,
        "INSERT INTO jobs.job (queue, state, retry_limit, retry_delay, retry_backoff,"
        " expire_seconds) VALUES ('usage-events', 'completed', 0, 0, false, 1)",
    )
    assert await refused(api_conn, "UPDATE jobs.job SET queue = 'x', policy = 'standard'")
    await api_conn.execute("UPDATE jobs.queue SET paused = true WHERE name = 'usage-events'")
    admin = await asyncpg.connect(migrated_db)
    try:
        row = await admin.fetchrow(
            "SELECT dead_letter, retry_limit, paused FROM jobs.queue WHERE name = 'usage-events'"
        )
    finally:
        await admin.close()
    assert tuple(row) == ("usage-events-held", 10, True)


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
async def test_api_role_serves_the_admin_reads_and_the_console_with_only_its_grants(
    migrated_db: str, admin_url: str, roles: Roles, tmp_path
) -> None:
    """An api process as the api role answers the queues document (with each queue's cron, read
    through queue_schedule), the job list, the console overview (whose chart it tallies itself,
    no worker running), the held page and /metrics, all 200."""
    dbname = urlsplit(migrated_db).path.lstrip("/")
    apply_roles(admin_url, roles, dbname=dbname)
    worker_url, api_url = as_role(migrated_db, roles.worker), as_role(migrated_db, roles.api)
    assert (await asyncio.to_thread(run_cli, worker_url, "migrate", cwd=tmp_path)).returncode == 0
    admin = await asyncpg.connect(migrated_db)
    try:
        done = await admin.fetchval("SELECT jobs.send('audit-purge', '{}')")
        await admin.execute(
            "INSERT INTO jobs.schedule (queue, cron) VALUES ('audit-purge', '5 4 * * *')"
            " ON CONFLICT (queue) DO UPDATE SET cron = EXCLUDED.cron"
        )
        await admin.execute(
            "UPDATE jobs.job SET state = 'completed', completed_at = now() WHERE id = $1", done
        )
    finally:
        await admin.close()
    daemon = start_daemon(api_url, tmp_path, role="api", name="api", env={"ADMIN_TOKEN": ADMIN})
    try:
        await asyncio.to_thread(daemon.wait_ready, 30)
        bearer = {"Authorization": f"Bearer {ADMIN}"}
        basic = {"Authorization": "Basic " + base64.b64encode(f"ops:{ADMIN}".encode()).decode()}
        queues = await asyncio.to_thread(httpx.get, daemon.url("/v1/admin/queues"), headers=bearer)
        assert queues.status_code == 200, queues.text
        crons = {q["name"]: q["cron"] for q in queues.json()["queues"]}
        assert crons["audit-purge"] == "5 4 * * *"
        jobs = await asyncio.to_thread(httpx.get, daemon.url("/v1/admin/jobs"), headers=bearer)
        assert jobs.status_code == 200, jobs.text
        assert [j["id"] for j in jobs.json()["jobs"]] == [done]
        for path in ("/console/", "/console/held", "/console/jobs"):
            page = await asyncio.to_thread(httpx.get, daemon.url(path), headers=basic)
            assert page.status_code == 200, (path, page.text[:500])
        status, text = await asyncio.to_thread(daemon.get, "/metrics")
        assert status == 200
        assert 'queue_jobs{queue="audit-purge",state="completed"}' in text
        assert daemon.stop() == 0, daemon.logs()
    finally:
        daemon.kill()
    assert "permission denied" not in daemon.logs()
    admin = await asyncpg.connect(migrated_db)
    try:
        # The chart's tally was written by the api process (no worker ran).
        assert await admin.fetchval("SELECT sum(completed) FROM jobs.job_minute") == 1
    finally:
        await admin.close()


@pytest.mark.slow
async def test_api_role_redrives_and_discards_held_usage_events_with_audit_rows(
    migrated_db: str, roles: Roles
) -> None:
    """The console's held tools run as the api role: a redrive re-sends the event to the usage
    queue and settles its held job, a discard cancels one, and each writes its audit row."""
    apply_roles(migrated_db, roles)
    admin = await asyncpg.create_pool(migrated_db, min_size=1, max_size=1)
    try:
        await make_queue(admin, "usage-events-held")
        await make_queue(admin, "usage-events", retry_limit=10, dead_letter="usage-events-held")
        events = ["01J00000000000000000000001", "01J00000000000000000000002"]
        for event_id in events:
            data = json.dumps({"id": event_id, "meter": "m", "quantity": 1.0, "workspace_id": "w"})
            await admin.execute(
                "SELECT jobs.send('usage-events-held', $1::jsonb, singleton_key => 'hub:400')",
                data,
            )
        async with Sender.connect(as_role(migrated_db, roles.api), max_size=2) as sender:
            store = HeldStore(sender)
            actor = Actor(via="console", principal="admin")
            assert await store.redrive(Selection.of(events[:1]), actor) == events[:1]
            assert await store.discard(Selection.of(events[1:]), actor) == events[1:]
        rows = await admin.fetch(
            "SELECT j.queue, j.state::text, j.data ->> 'id' FROM jobs.job j ORDER BY j.id"
        )
        assert [tuple(r) for r in rows] == [
            ("usage-events-held", "completed", events[0]),
            ("usage-events-held", "cancelled", events[1]),
            ("usage-events", "created", events[0]),
        ]
        actions = [r["action"] for r in await admin.fetch("SELECT action FROM public.audit_log")]
        assert sorted(actions) == ["usage.discard", "usage.redrive"]
    finally:
        await admin.close()
