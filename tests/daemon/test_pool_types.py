"""Pool connections (the worker's and a Sender's) know their array types before any statement
needs them."""

from __future__ import annotations

import re
from pathlib import Path

from api_sender.pool import ARRAY_TYPES
from worker.db.connections import open_pool

ROOT = Path(__file__).resolve().parents[2]
#: A cast to an array of a built-in type in a statement's text (the schema's own types aside).
CAST = re.compile(r"::([a-z][a-z0-9]*)\[\]")


async def test_a_new_pool_connection_has_learned_every_array_codec(db_url: str) -> None:
    """asyncpg looks a type up on a connection's first statement that binds it, in three
    statements that a transaction pooler may spread over three server sessions (the lookup then
    runs with JIT on, for over a second). Each pool connection learns them in one transaction as
    it opens: its codec cache holds every array type the worker binds before its first use. (A
    plain asyncpg connection knows only text[] of these; this reads asyncpg's own cache.)"""
    pool = await open_pool(db_url, size=2, statement_cache_size=0)
    try:
        async with pool.acquire() as conn:
            oids = {t: await conn.fetchval(f"SELECT '{t}'::regtype::oid") for t in ARRAY_TYPES}
            settings = conn._con._protocol.get_settings()  # type: ignore[attr-defined]
            missing = [t for t, oid in oids.items() if settings.get_data_codec(oid) is None]
            # Nothing was left prepared on the server session (a pooler's sessions are shared).
            prepared = await conn.fetchval("SELECT count(*) FROM pg_prepared_statements")
    finally:
        await pool.close()
    assert missing == []
    assert prepared == 0


def test_the_learned_types_cover_every_array_cast_of_the_statements() -> None:
    """A statement binding an array type the list lacks would meet the slow lookup again."""
    casts = set()
    for package in ("worker", "api_sender"):
        for path in (ROOT / package).rglob("*.py"):
            casts.update(CAST.findall(path.read_text()))
    assert {f"{t}[]" for t in casts} <= set(ARRAY_TYPES)
