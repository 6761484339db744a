"""The SQL enqueue functions of migration 0007 (contract section 11) on a real PostgreSQL: the
same policies, overrides, NOTIFY and counts as api_sender, the documented SQLSTATEs for bad
arguments with nothing written, and the api role of config/roles.sql calling them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import asyncpg
import pytest

from api_sender import InvalidJob, QueueNotFound, Sender
from api_sender.errors import sender_error
from tests.support.counts import reported_counts
from tests.support.postgres import create_database, drop_database, with_database
from tests.support.queues import make_queue
from tests.support.roles import Roles, apply_roles, as_role, fresh_roles, refused
from tests.support.tools import require_tool

#: A JSON event the usage function accepts.
EVENT = '{"meter": "api.calls", "quantity": 1, "workspace_id": "w1"}'


async def _queues(pool: asyncpg.Pool) -> None:
    await make_queue(pool, "q", retry_limit=3, retry_delay=5)
    await make_queue(pool, "once", policy="short")
    await make_queue(pool, "usage-events", retry_limit=10, retry_delay=30, retry_backoff=True)


@pytest.fixture
async def conn(pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Connection]:
    """A connection on a database with queues q (standard), once (short) and usage-events."""
    await _queues(pool)
    async with pool.acquire() as connection:
        yield connection


async def jobs_written(conn: asyncpg.Connection) -> tuple[int, int]:
    """(jobs, counter rows): what a refused call must leave at zero."""
    jobs = await conn.fetchval("SELECT count(*) FROM jobs.job")
    counters = await conn.fetchval("SELECT count(*) FROM jobs.job_count")
    return jobs, counters


async def test_send_uses_the_queue_policy_and_per_send_overrides(conn) -> None:
    """send stores the queue's retry policy unless overridden; a delay or an instant sets the
    due time; a short queue refuses a second queued job of a key with NULL, not an error."""
    first = await conn.fetchval("SELECT jobs.send('q', '{\"k\": 1}')")
    row = await conn.fetchrow(
        "SELECT queue, policy, data::text, priority, retry_limit, retry_delay, retry_backoff,"
        " expire_seconds, start_after <= now() AS due FROM jobs.job WHERE id = $1",
        first,
    )
    assert tuple(row.values()) == ("q", "standard", '{"k": 1}', 0, 3, 5, False, 900, True)
    later = await conn.fetchval(
        "SELECT jobs.send('q', '{}', start_after => interval '30 seconds', singleton_key => 'k1',"
        " priority => 5, retry_limit => 0, retry_delay => 9, retry_backoff => true,"
        " expire_in_seconds => 60)"
    )
    row = await conn.fetchrow(
        "SELECT singleton_key, priority, retry_limit, retry_delay, retry_backoff, expire_seconds,"
        " round(extract(epoch FROM start_after - created_at)) AS delay FROM jobs.job WHERE id = $1",
        later,
    )
    assert tuple(row.values()) == ("k1", 5, 0, 9, True, 60, 30)
    at = await conn.fetchval("SELECT jobs.send('q', start_at => '2030-01-01T00:00:00Z')")
    assert await conn.fetchval(
        "SELECT start_after = '2030-01-01T00:00:00Z' FROM jobs.job WHERE id = $1", at
    )
    bare = await conn.fetchval("SELECT jobs.send('q')")
    assert await conn.fetchval("SELECT data FROM jobs.job WHERE id = $1", bare) == "null"
    assert await conn.fetchval("SELECT jobs.send('once', '{}', singleton_key => 'k')") is not None
    assert await conn.fetchval("SELECT jobs.send('once', '{}', singleton_key => 'k')") is None


async def test_send_many_returns_ids_in_order_and_leaves_refused_keys_out(conn) -> None:
    """send_many stores every item with the shared options, all in one statement; per-item
    keys on a short queue leave a refused key out of the ids; an empty array stores nothing."""
    ids = await conn.fetchval(
        "SELECT jobs.send_many('q', ARRAY['{\"n\": 1}', '{\"n\": 2}', NULL]::jsonb[],"
        " priority => 2)"
    )
    assert len(ids) == 3
    assert ids == sorted(ids)
    rows = await conn.fetch(
        "SELECT data::text, priority FROM jobs.job WHERE id = ANY($1) ORDER BY id", ids
    )
    assert [tuple(r.values()) for r in rows] == [('{"n": 1}', 2), ('{"n": 2}', 2), ("null", 2)]
    keyed = await conn.fetchval(
        "SELECT jobs.send_many('once', ARRAY['{}', '{}', '{}']::jsonb[],"
        " singleton_keys => ARRAY['a', 'a', NULL], singleton_key => 'shared')"
    )
    keys = await conn.fetch("SELECT singleton_key FROM jobs.job WHERE id = ANY($1)", keyed)
    assert sorted(r["singleton_key"] for r in keys) == ["a", "shared"]
    assert await conn.fetchval("SELECT jobs.send_many('q', '{}'::jsonb[])") == []


async def test_notify_is_transactional_and_carries_the_queue_only_when_due(conn, pool) -> None:
    """One NOTIFY per call on the schema's channel, delivered on commit, none on rollback: the
    queue name for a job due now, an empty payload for a later one (as api_sender's)."""
    received: list[str] = []
    async with pool.acquire() as listener:

        def heard(*args: object) -> None:
            received.append(str(args[3]))

        await listener.add_listener("chassis_jobs_jobs", heard)
        async with conn.transaction():
            await conn.fetchval("SELECT jobs.send('q', '{}')")
            await conn.fetchval("SELECT jobs.send_many('q', ARRAY['{}', '{}']::jsonb[])")
            await asyncio.sleep(0.2)
            assert received == []  # nothing before the commit
        tx = conn.transaction()
        await tx.start()
        await conn.fetchval("SELECT jobs.send('q', '{}')")
        await tx.rollback()
        await conn.fetchval("SELECT jobs.send('q', '{}', start_after => interval '1 hour')")
        await conn.fetchval(
            "SELECT jobs.schedule_timer('q', at => now() + interval '1 day', key => 't')"
        )
        await conn.fetchval("SELECT jobs.send('once', '{}', singleton_key => 'x')")
        await conn.fetchval("SELECT jobs.send('once', '{}', singleton_key => 'x')")  # refused
        for _ in range(50):
            if len(received) >= 4:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.2)
        await listener.remove_listener("chassis_jobs_jobs", heard)
    # The two sends of the first transaction are one notification: PostgreSQL folds identical
    # notifications of one transaction (api_sender's statements rely on it too).
    assert received == ["q", "", "", "once"]


async def test_timers_replace_by_key_cancel_and_keep_the_counts(conn) -> None:
    """schedule_timer with a key cancels the pending timer of that key; cancel_timer is true
    once and false after (and for a queue with no timers); the counting triggers of 0005 count
    the cancels."""
    first = await conn.fetchval(
        "SELECT jobs.schedule_timer('q', at => now() + interval '1 day', data => '{}', key => 'u7')"
    )
    second = await conn.fetchval(
        "SELECT jobs.schedule_timer('q', now() + interval '2 days', '{\"v\": 2}', 'u7')"
    )
    states = dict(await conn.fetch("SELECT id, state::text FROM jobs.job ORDER BY id"))
    assert states == {first: "cancelled", second: "created"}
    assert await conn.fetchval("SELECT jobs.cancel_timer('q', 'u7')") is True
    assert await conn.fetchval("SELECT jobs.cancel_timer('q', 'u7')") is False
    unkeyed = await conn.fetchval("SELECT jobs.schedule_timer('q', now())")
    assert await conn.fetchval("SELECT is_timer FROM jobs.job WHERE id = $1", unkeyed) is False
    assert (await reported_counts(conn))[("q", "cancelled")] == 2


async def test_emit_usage_enqueues_the_event_as_the_sink_does(conn) -> None:
    """emit_usage returns the event id, a new ULID when absent, and enqueues the event on
    usage-events keyed by its id with backoff on, occurred_at now() when absent."""
    event_id = await conn.fetchval("SELECT jobs.emit_usage($1::json)", EVENT)
    assert len(event_id) == 26
    row = await conn.fetchrow(
        "SELECT data, singleton_key, retry_limit, retry_delay, retry_backoff,"
        " (data->>'occurred_at')::timestamptz = created_at AS now"
        " FROM jobs.job WHERE queue = 'usage-events'"
    )
    assert row["singleton_key"] == event_id
    assert (row["retry_limit"], row["retry_delay"], row["retry_backoff"]) == (10, 30, True)
    assert row["now"] is True
    assert set(json.loads(row["data"])) == {
        "id",
        "meter",
        "quantity",
        "occurred_at",
        "workspace_id",
    }
    ids = {await conn.fetchval("SELECT jobs.emit_usage($1::json)", EVENT) for _ in range(20)}
    assert len(ids) == 20  # new ULIDs, all different


#: (statement, SQLSTATE, the argument the error names).
BAD_CALLS: list[tuple[str, str, str]] = [
    ("SELECT jobs.send('nope', '{}')", "P0002", "queue"),
    ("SELECT jobs.send('', '{}')", "22023", "queue"),
    ("SELECT jobs.send(NULL, '{}')", "22023", "queue"),
    ("SELECT jobs.send('q', '{}', priority => NULL)", "22023", "priority"),
    ("SELECT jobs.send('q', '{}', singleton_key => '')", "22023", "singleton_key"),
    ("SELECT jobs.send('q', '{}', retry_limit => -1)", "22023", "retry_limit"),
    ("SELECT jobs.send('q', '{}', retry_delay => -1)", "22023", "retry_delay"),
    ("SELECT jobs.send('q', '{}', expire_in_seconds => 0)", "22023", "expire_in_seconds"),
    ("SELECT jobs.send('q', '{}', start_after => interval '-1 second')", "22023", "start_after"),
    ("SELECT jobs.send('q', '{}', start_after => interval '101 years')", "22023", "start_after"),
    (
        "SELECT jobs.send('q', '{}', start_at => '10000-01-01T00:00:00Z')",
        "22023",
        "start_at",
    ),
    (
        "SELECT jobs.send('q', '{}', start_after => interval '1 s', start_at => now())",
        "22023",
        "start_at",
    ),
    ("SELECT jobs.send_many('nope', ARRAY['{}']::jsonb[])", "P0002", "queue"),
    ("SELECT jobs.send_many('q', NULL)", "22023", "data"),
    ("SELECT jobs.send_many('q', ARRAY[['{}'], ['{}']]::jsonb[])", "22023", "data"),
    ("SELECT jobs.send_many('q', ARRAY['{}']::jsonb[], priority => NULL)", "22023", "priority"),
    (
        "SELECT jobs.send_many('q', ARRAY['{}', '{}']::jsonb[], singleton_keys => ARRAY['a'])",
        "22023",
        "singleton_keys",
    ),
    (
        "SELECT jobs.send_many('q', ARRAY['{}', '{}']::jsonb[], singleton_keys => ARRAY['a', ''])",
        "22023",
        "singleton_keys.1",
    ),
    ("SELECT jobs.schedule_timer('nope', now(), '{}', 'k')", "P0002", "queue"),
    ("SELECT jobs.schedule_timer('q', NULL)", "22023", "at"),
    ("SELECT jobs.schedule_timer('q', '10000-01-01T00:00:00Z')", "22023", "at"),
    ("SELECT jobs.schedule_timer('q', now(), key => '')", "22023", "key"),
    ("SELECT jobs.schedule_timer('', now())", "22023", "queue"),
    ("SELECT jobs.cancel_timer('q', NULL)", "22023", "key"),
    ("SELECT jobs.cancel_timer('', 'k')", "22023", "queue"),
    ("SELECT jobs.cancel_timer('nope', 'k')", "P0002", "queue"),
    ("SELECT jobs.emit_usage(NULL)", "22023", "(event)"),
    (
        """SELECT jobs.emit_usage('{"meter": "m", "quantity": -1, "workspace_id": "w"}')""",
        "22023",
        "quantity",
    ),
]


@pytest.mark.parametrize(("statement", "sqlstate", "field"), BAD_CALLS)
async def test_bad_arguments_raise_the_documented_sqlstate_and_write_nothing(
    conn, statement: str, sqlstate: str, field: str
) -> None:
    """Each bad argument raises its SQLSTATE with the argument named in the message's COLUMN
    field, and api_sender maps it (QueueNotFound, InvalidJob naming the field); no job and no
    counter row is written, even when the call had already cancelled a timer of its key."""
    await conn.fetchval("SELECT jobs.schedule_timer('q', now() + interval '1 day', key => 'k')")
    before = await jobs_written(conn)
    with pytest.raises(asyncpg.PostgresError) as caught:
        await conn.fetchval(statement)
    assert caught.value.sqlstate == sqlstate
    assert caught.value.column_name == field
    mapped = sender_error(caught.value, queue="nope", schema="jobs")
    if sqlstate == "P0002":
        assert isinstance(mapped, QueueNotFound)
        assert "nope" in caught.value.message
    else:
        assert isinstance(mapped, InvalidJob)
        assert mapped.field == field
        assert field.split(".")[0].strip("()") in caught.value.message or field == "(event)"
    assert await jobs_written(conn) == before
    assert await conn.fetchval("SELECT count(*) FROM jobs.job WHERE state = 'cancelled'") == 0


async def test_an_uninstalled_usage_queue_is_p0002(conn) -> None:
    """emit_usage with no usage-events queue raises P0002 naming it."""
    tx = conn.transaction()
    await tx.start()
    try:
        await conn.execute("DELETE FROM jobs.queue WHERE name = 'usage-events'")
        with pytest.raises(asyncpg.PostgresError) as caught:
            await conn.fetchval("SELECT jobs.emit_usage($1::json)", EVENT)
    finally:
        await tx.rollback()
    assert caught.value.sqlstate == "P0002"
    assert "usage-events" in caught.value.message
    assert await jobs_written(conn) == (0, 0)


async def test_sender_maps_the_function_errors(sender: Sender, pool) -> None:
    """Sender.send, send_many and timers keep raising QueueNotFound for an unknown queue."""
    await _queues(pool)
    with pytest.raises(QueueNotFound, match="nope"):
        await sender.send("nope", {})
    with pytest.raises(QueueNotFound, match="nope"):
        await sender.send_many("nope", [{}])
    with pytest.raises(QueueNotFound, match="nope"):
        await sender.timers.schedule("nope", delay_seconds=1, key="k")
    assert await sender.timers.cancel("nope", "k") is False


async def test_an_unknown_queue_aborts_nothing_of_the_callers_transaction(
    sender: Sender, pool, db_url: str
) -> None:
    """On the sender's own pool or autocommit connection a send runs alone (the function
    raises P0002 and nothing else is lost); inside a caller's transaction it looks the queue
    up first, so QueueNotFound leaves that transaction open and its other work commits."""
    psycopg = pytest.importorskip("psycopg")
    from api_sender import SyncSender

    await _queues(pool)
    async with pool.acquire() as conn:
        async with conn.transaction():
            await conn.execute("CREATE TABLE mine (n int)")
            await conn.execute("INSERT INTO mine VALUES (1)")
            with pytest.raises(QueueNotFound):
                await sender.send("nope", {}, connection=conn)
            with pytest.raises(QueueNotFound):
                await sender.send_many("nope", [{}], connection=conn)
            kept = await sender.send("q", {"n": 1}, connection=conn)
        assert await conn.fetchval("SELECT count(*) FROM mine") == 1

    def in_psycopg() -> int | None:
        with psycopg.connect(db_url) as caller, SyncSender.connect(db_url) as own:
            caller.execute("INSERT INTO mine VALUES (2)")
            with pytest.raises(QueueNotFound):
                own.send("nope", {}, connection=caller)
            with caller.transaction(), pytest.raises(QueueNotFound):
                SyncSender(caller).send("nope", {})
            job = own.send("q", {"n": 2}, connection=caller)
            caller.commit()
            with pytest.raises(QueueNotFound):
                own.send("nope", {})
            return job

    psycopg_job = await asyncio.to_thread(in_psycopg)
    assert await pool.fetchval("SELECT count(*) FROM mine") == 2
    rows = await pool.fetch("SELECT id FROM jobs.job ORDER BY id")
    assert [row["id"] for row in rows] == [kept, psycopg_job]


# --- The api role of config/roles.sql --------------------------------------------------------


@pytest.fixture
async def roles(admin_url: str) -> AsyncIterator[Roles]:
    """Fresh role names, dropped after the test's database is gone."""
    async with fresh_roles(admin_url, "f") as names:
        yield names


@pytest.fixture
async def roles_db(roles: Roles, admin_url: str, template_name: str) -> AsyncIterator[str]:
    """A migrated database with the test queues; dropped before the roles."""
    name = await create_database(admin_url, template_name)
    url = with_database(admin_url, name)
    try:
        pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
        try:
            await _queues(pool)
        finally:
            await pool.close()
        yield url
    finally:
        await drop_database(admin_url, name)


async def test_the_api_role_calls_every_function_yet_cannot_create_or_delete(
    roles_db: str, admin_url: str, roles: Roles
) -> None:
    """With only what config/roles.sql grants, the api role sends, sends many, schedules and
    cancels timers and emits usage through the functions (and through Sender, which calls
    them), yet still cannot CREATE or DELETE."""
    require_tool("psql", "postgresql-client")
    apply_roles(admin_url, roles, dbname=urlsplit(roles_db).path.lstrip("/"))
    api = await asyncpg.connect(as_role(roles_db, roles.api))
    try:
        assert await api.fetchval("SELECT current_user") == roles.api
        assert await api.fetchval("SELECT jobs.send('q', '{}')") is not None
        assert len(await api.fetchval("SELECT jobs.send_many('q', ARRAY['{}']::jsonb[])")) == 1
        assert await api.fetchval("SELECT jobs.schedule_timer('q', now(), '{}', 'k')") is not None
        assert await api.fetchval("SELECT jobs.cancel_timer('q', 'k')") is True
        assert len(await api.fetchval("SELECT jobs.emit_usage($1::json)", EVENT)) == 26
        assert await refused(api, "CREATE TABLE jobs.intruder (id int)")
        assert await refused(api, "CREATE SCHEMA intruder")
        assert await refused(api, "DELETE FROM jobs.job")
        assert await refused(api, "TRUNCATE jobs.job")
        assert await api.fetchval("SELECT has_schema_privilege('jobs', 'CREATE')") is False
        for name in ("send", "send_many", "emit_usage", "schedule_timer", "cancel_timer"):
            granted = await api.fetchval(
                "SELECT bool_and(has_function_privilege(p.oid, 'EXECUTE')) FROM pg_proc p"
                " WHERE p.pronamespace = 'jobs'::regnamespace AND p.proname = $1",
                name,
            )
            assert granted is True, name
            definer = await api.fetchval(
                "SELECT bool_or(p.prosecdef) FROM pg_proc p"
                " WHERE p.pronamespace = 'jobs'::regnamespace AND p.proname = $1",
                name,
            )
            assert definer is False, f"{name} must be SECURITY INVOKER"
    finally:
        await api.close()
    async with Sender.connect(as_role(roles_db, roles.api), max_size=1) as sender:
        assert await sender.send("q", {"via": "sender"}) is not None
        assert len(await sender.send_many("q", [{}, {}])) == 2
        assert await sender.timers.schedule("q", delay_seconds=60, key="s") is not None
        assert await sender.timers.cancel("q", "s") is True
    admin = await asyncpg.connect(roles_db)
    try:
        assert await admin.fetchval("SELECT count(*) FROM jobs.job") == 8
    finally:
        await admin.close()
