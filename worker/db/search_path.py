"""Whether the session's search_path names a schema where another role may create objects.

The daemon's statements name their tables by schema, but call built-ins (``unnest``,
``make_interval``, ``jsonb_build_object``, operators) by their plain names, which PostgreSQL
looks up on the search_path, pg_catalog first. A function or operator in a later schema that
matches a call's argument types better than pg_catalog's (``unnest(bigint[])`` beside
``unnest(anyarray)``) is the one that runs (CVE-2018-1058), inside the daemon's statement, with
the daemon role's rights: a role that may CREATE in ``public`` could act as the worker role,
which owns the queue schema. PostgreSQL 15 grants no one CREATE on ``public`` by default; older
servers grant it to every role, and anyone may grant it since.

The functions of the queue schema pin their own search_path (migration 0009); the sessions'
path is the operator's (and the handlers' queries rely on it), so the daemon checks it once at
boot and says what to revoke, rather than changing it.
"""

from __future__ import annotations

import asyncpg
import structlog

from api_sender.query import Query

from . import statements as db

log = structlog.get_logger("worker.db")

#: For each schema on the session's effective search_path, the roles that may CREATE in it and
#: that this session does not trust: PUBLIC, or a role that is neither a superuser nor the
#: session's user or one of its roles. pg_database_owner stands for the database's owner.
_UNTRUSTED_CREATORS = Query(
    "untrusted_creators",
    """
-- search_path check at boot: read-only, catalog tables only, every name qualified. The roles
-- this session acts as are its user and the roles it is a member of, by pg_auth_members itself
-- (pg_has_role would say a superuser is a member of every role).
WITH RECURSIVE mine (oid) AS (
    SELECT r.oid FROM pg_catalog.pg_roles AS r WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER
    UNION
    SELECT m.roleid FROM pg_catalog.pg_auth_members AS m
    JOIN mine ON m.member OPERATOR(pg_catalog.=) mine.oid
), grants AS (
    SELECT n.nspname, a.grantee
    FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) AS s (name)
    JOIN pg_catalog.pg_namespace AS n ON n.nspname OPERATOR(pg_catalog.=) s.name
    CROSS JOIN LATERAL pg_catalog.aclexplode(
        COALESCE(n.nspacl, pg_catalog.acldefault('n', n.nspowner))) AS a
    WHERE a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
), resolved AS (
    SELECT g.nspname, g.grantee,
           CASE WHEN r.rolname OPERATOR(pg_catalog.=) 'pg_database_owner'
                THEN d.datdba ELSE g.grantee END AS acting
    FROM grants AS g
    LEFT JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) g.grantee
    CROSS JOIN pg_catalog.pg_database AS d
    WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
)
SELECT x.nspname AS schema,
       pg_catalog.array_agg(DISTINCT CASE WHEN x.grantee OPERATOR(pg_catalog.=) 0
                                          THEN 'PUBLIC' ELSE r.rolname END) AS roles
FROM resolved AS x
LEFT JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) x.acting
WHERE x.grantee OPERATOR(pg_catalog.=) 0
   OR NOT (r.rolsuper OR x.acting IN (SELECT mine.oid FROM mine))
GROUP BY x.nspname
ORDER BY x.nspname
""",
).render("public")


async def warn_if_unsafe(pool: asyncpg.Pool) -> list[str]:
    """Log ``db.search_path_unsafe`` once for each schema on the session's search_path in which
    a role this session does not trust may create objects; return those schemas. A diagnostic:
    a failure to look is logged at debug level, never raised."""
    try:
        rows = await db.fetch(pool, _UNTRUSTED_CREATORS)
    except (asyncpg.PostgresError, OSError) as exc:
        log.debug("db.search_path_check_failed", error=f"{type(exc).__name__}: {exc}")
        return []
    for row in rows:
        log.warning(
            "db.search_path_unsafe",
            schema=row["schema"],
            roles=sorted(row["roles"]),
            hint=(
                f"these roles may create functions in schema {row['schema']!r}, which is on this "
                "role's search_path, and so run code with this role's rights; revoke it "
                f"(REVOKE CREATE ON SCHEMA {row['schema']} FROM ...), as PostgreSQL 15 does for "
                "public by default"
            ),
        )
    return [str(row["schema"]) for row in rows]
