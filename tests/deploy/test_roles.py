"""config/roles.sql on a real PostgreSQL: an enqueue-only api role, an installing worker role."""

from __future__ import annotations

import asyncio
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

from api_sender import PermissionDenied, Sender, UsageEvent
from tests.support.counts import reported_counts
from tests.support.postgres import create_database, drop_database, with_database
from tests.support.processes import Daemon, run_cli, start_daemon
from tests.support.queues import make_queue
from tests.support.roles import Roles, apply_roles, as_role, fresh_roles, refused

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
