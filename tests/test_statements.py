"""One convention for SQL: every statement a ``Query`` with ``:name`` parameters, bound by name.

The worker passes no positional ``$n`` arguments anywhere: a statement and the values given to it
cannot drift apart by position, and a value missing or left over is refused before the database
is asked.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import asyncpg
import pytest

from api_sender.query import Query
from worker.db import statements as db
from worker.jobs.usage import sql as held_sql
from worker.queue import sql as queue_sql

ROOT = Path(__file__).resolve().parent.parent
POSITIONAL = re.compile(r"\$\d")


def _string_constants(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_no_worker_statement_has_positional_parameters() -> None:
    """Seen failing before the convention: worker/queue/sql.py, the purges, the held tools and
    six inline statements all used ``$1..$n``."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "worker").rglob("*.py"))
        for line, text in _string_constants(path)
        if POSITIONAL.search(re.sub(r"--[^\n]*", "", text))
    ]
    assert offenders == []


def test_every_engine_statement_is_listed_once_and_renders() -> None:
    names = [query.name for query in queue_sql.STATEMENTS]
    assert len(names) == len(set(names))
    rendered = queue_sql.render("jobs")
    for query in queue_sql.STATEMENTS:
        statement = getattr(rendered, query.name)
        assert "{" not in statement.text, query.name  # every slot filled
        # a parameter named in a comment only would make asyncpg count one argument too many
        code = re.sub(r"--[^\n]*", "", statement.text)
        for n, name in enumerate(statement.parameters, start=1):
            assert re.search(rf"\${n}\b", code), (query.name, name)
    held = held_sql.render("jobs")
    assert held.discard.parameters  # the held tools render the same way


async def test_a_missing_or_extra_value_is_refused_before_the_database(
    pool: asyncpg.Pool,
) -> None:
    statement = Query("pair", "SELECT :a::int + :b::int").render("jobs")
    assert await db.fetchval(pool, statement, a=1, b=2) == 3
    with pytest.raises(TypeError, match=r"missing \['b'\]"):
        await db.fetchval(pool, statement, a=1)
    with pytest.raises(TypeError, match=r"unexpected \['c'\]"):
        await db.fetchval(pool, statement, a=1, b=2, c=3)
