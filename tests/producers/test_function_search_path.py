"""The functions of the queue schema pin their search_path (issue 28): a look-alike that a role
able to CREATE in public plants (CVE-2018-1058) never runs inside them with the caller's rights,
whatever search_path the caller has."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import asyncpg
import pytest

from tests.support.postgres import create_database, drop_database, with_database
from tests.support.queues import make_queue
from tests.support.roles import Roles, apply_roles, as_role, extra_role, fresh_roles
from tests.support.tools import require_tool
from worker.db.migrations import migrate

_CONFIGS = """
SELECT p.oid::regprocedure::text AS name, p.proname, p.proconfig
FROM pg_proc p WHERE p.pronamespace = $1::regnamespace ORDER BY 1
"""


def search_path_of(config: list[str] | None) -> list[str] | None:
    """The schemas a function's proconfig pins its search_path to, unquoted; None if unset."""
    entries = [e.split("=", 1)[1] for e in config or [] if e.startswith("search_path=")]
    if len(entries) != 1:
        return None
    return [part.strip().strip('"') for part in entries[0].split(",")]


def is_safe(path: list[str] | None, schema: str) -> bool:
    """pg_catalog first (explicitly), then at most the queue schema, then at most pg_temp (last,
    so no temporary table shadows one): no other schema, public least of all."""
    if not path or path[0] != "pg_catalog" or len(set(path)) != len(path):
        return False
    return path[1:] in ([], [schema], ["pg_temp"], [schema, "pg_temp"])


async def assert_every_function_pins(conn: asyncpg.Connection, schema: str) -> None:
    """Every function of ``schema`` pins a safe search_path (:func:`is_safe`)."""
    rows = await conn.fetch(_CONFIGS, schema)
    assert rows
    unsafe = {
        r["name"]: r["proconfig"]
        for r in rows
        if not is_safe(search_path_of(r["proconfig"]), schema)
    }
    assert unsafe == {}


async def test_every_function_of_the_queue_schema_pins_its_search_path(db_url: str) -> None:
    """On a migrated database each function of the queue schema (the enqueue functions of 0007
    and 0008, their helpers, the job_count functions of 0005) has a search_path of pg_catalog,
    the queue schema and pg_temp only: never public, never the caller's."""
    conn = await asyncpg.connect(db_url)
    try:
        await assert_every_function_pins(conn, "jobs")
        names = {r["proname"] for r in await conn.fetch(_CONFIGS, "jobs")}
        assert {"send", "send_many", "emit_usage", "job_count_add", "job_count_changed"} <= names
    finally:
        await conn.close()


async def test_the_pinned_search_path_names_the_schema_the_install_used(
    empty_db_url: str,
) -> None:
    """Migrated into another JOBS_SCHEMA, the functions pin that schema (the migration reads
    current_schema(), as the runner sets it), and emit_usage keeps its own extra_float_digits."""
    conn = await asyncpg.connect(empty_db_url)
    try:
        await migrate(conn, "chassis_q", lock_timeout=30)
        await assert_every_function_pins(conn, "chassis_q")
        config = await conn.fetchval(
            "SELECT proconfig FROM pg_proc WHERE oid = 'chassis_q.emit_usage(json)'::regprocedure"
        )
        assert sorted(config) == [
            "extra_float_digits=1",
            "search_path=pg_catalog, chassis_q, pg_temp",
        ]
    finally:
        await conn.close()


# --- A real hijack ---------------------------------------------------------------------------

#: Another role on the server that may CREATE in public (any role on PostgreSQL 14 and older,
#: unless revoked) plants look-alikes of built-ins the function bodies call. Each records who
#: ran it, then does what the built-in does, so the victim's call succeeds and notices nothing.
LOOK_ALIKES = """
CREATE TABLE public.hijack_marks (who text NOT NULL, what text NOT NULL);
GRANT INSERT ON public.hijack_marks TO PUBLIC;
-- emit_usage's occurred_at: make_timestamp(int, int, int, int, int, sec + micro / 1000000.0),
-- a numeric where pg_catalog's takes float8: an exact match beats the implicit cast, so this
-- wins even when pg_catalog comes first on the path.
CREATE FUNCTION public.make_timestamp(integer, integer, integer, integer, integer, numeric)
RETURNS timestamp LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.hijack_marks VALUES (current_user, 'make_timestamp');
    RETURN pg_catalog.make_timestamp($1, $2, $3, $4, $5, $6::float8);
END $$;
-- send's NOTIFY: the same argument types as pg_catalog's, so it wins for a caller whose path
-- names public before pg_catalog.
CREATE FUNCTION public.pg_notify(text, text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.hijack_marks VALUES (current_user, 'pg_notify');
    PERFORM pg_catalog.pg_notify($1, $2);
END $$;
-- _send_due's range check of start_after: extract(...) NOT BETWEEN 0 AND ..., which the parser
-- makes extract(...) < 0 OR ...: numeric < integer. An operator on exactly (numeric, integer)
-- beats pg_catalog's (numeric, numeric), which needs the integer cast.
CREATE FUNCTION public.hijack_lt(numeric, integer) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.hijack_marks VALUES (current_user, '<');
    RETURN $1 OPERATOR(pg_catalog.<) $2::numeric;
END $$;
CREATE OPERATOR public.< (LEFTARG = numeric, RIGHTARG = integer, FUNCTION = public.hijack_lt);
"""


@dataclass(frozen=True)
class Planted:
    """A migrated database with the test queues, roles.sql applied, and the look-alikes of
    :data:`LOOK_ALIKES` planted in public by another role."""

    url: str
    roles: Roles

    async def connect_api(self, search_path: str) -> asyncpg.Connection:
        """A connection as the api role with this search_path."""
        return await asyncpg.connect(
            as_role(self.url, self.roles.api), server_settings={"search_path": search_path}
        )

    async def marks(self) -> list[tuple[str, str]]:
        """Who ran which look-alike."""
        admin = await asyncpg.connect(self.url)
        try:
            rows = await admin.fetch("SELECT who, what FROM public.hijack_marks ORDER BY 1, 2")
        finally:
            await admin.close()
        return [(r["who"], r["what"]) for r in rows]


@pytest.fixture
async def planted(admin_url: str, template_name: str) -> AsyncIterator[Planted]:
    """See :class:`Planted`; the database is dropped before the roles."""
    require_tool("psql", "postgresql-client")
    async with fresh_roles(admin_url, "h") as roles, extra_role(admin_url, "h") as attacker:
        name = await create_database(admin_url, template_name)
        url = with_database(admin_url, name)
        try:
            pool = await asyncpg.create_pool(url, min_size=1, max_size=1)
            try:
                await make_queue(pool, "q")
                await make_queue(pool, "usage-events", retry_limit=10, retry_backoff=True)
                await pool.execute(f'GRANT CREATE ON SCHEMA public TO "{attacker}"')
            finally:
                await pool.close()
            apply_roles(admin_url, roles, dbname=urlsplit(url).path.lstrip("/"))
            other = await asyncpg.connect(as_role(url, attacker))
            try:
                await other.execute(LOOK_ALIKES)
            finally:
                await other.close()
            yield Planted(url, roles)
        finally:
            await drop_database(admin_url, name)


async def test_a_better_matching_look_alike_never_runs_inside_emit_usage(
    planted: Planted,
) -> None:
    """The api role emitting a usage event with the default search_path ("$user", public) does
    not run the make_timestamp look-alike in public, though it matches the call's argument
    types better than pg_catalog's, and the event is stored."""
    api = await planted.connect_api('"$user", public')
    try:
        event = (
            '{"meter": "m", "quantity": 1, "workspace_id": "w",'
            ' "occurred_at": "2026-01-01T00:00:00Z"}'
        )
        assert len(await api.fetchval("SELECT jobs.emit_usage($1::json)", event)) == 26
        # And the caller's own statements still see its own path, untouched by the function's.
        assert await api.fetchval("SHOW search_path") == '"$user", public'
    finally:
        await api.close()
    assert await planted.marks() == []


@pytest.mark.parametrize(
    ("search_path", "call"),
    [
        # The look-alike pg_notify, same types as pg_catalog's, first on the caller's path.
        ("public, pg_catalog", "SELECT jobs.send('q', '{}'::jsonb)"),
        # The look-alike < (numeric, integer) on the default path: better typed than any.
        ('"$user", public', "SELECT jobs.send('q', '{}'::jsonb, start_after => '1 hour')"),
    ],
)
async def test_no_look_alike_runs_inside_send_whatever_the_callers_path(
    planted: Planted, search_path: str, call: str
) -> None:
    """The api role sending a job with a search_path that names public (first, or after
    "$user") runs neither the pg_notify nor the < look-alike planted there, and the job is
    stored."""
    api = await planted.connect_api(search_path)
    try:
        assert await api.fetchval(call) is not None
    finally:
        await api.close()
    assert await planted.marks() == []
