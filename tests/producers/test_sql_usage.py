"""jobs.emit_usage refuses exactly what the HTTP ingest refuses (contract section 11): one table
of events, each posted to POST /v1/usage-events (in process, over this test's database) and
passed to the SQL function as the same JSON text. An accepted event is stored identically by
both; a refused one is a 400 (413 above 1 MiB) there and SQLSTATE 22023 here, and neither
stores anything. The one difference the contract makes, an absent occurred_at, is tested apart.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from api_sender import Sender
from tests.support.queues import make_queue
from worker.http.app import create_app
from worker.settings import Settings
from worker.state import ServiceState

TOKEN = "sql-usage-token"
ID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
AT = "2024-05-01T12:00:00Z"
MIB = 1 << 20


def event(**fields: Any) -> str:
    """An event's JSON text: a valid one, with ``fields`` added or replaced (None drops one)."""
    base: dict[str, Any] = {
        "id": ID,
        "meter": "api.calls",
        "quantity": 1,
        "occurred_at": AT,
        "workspace_id": "w1",
    }
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not None}, ensure_ascii=False)


def raw(text: str) -> str:
    """An event given as JSON text written by hand (NUL escapes, duplicate keys, literals)."""
    return text


def _padded(size: int) -> str:
    """A valid event of exactly ``size`` bytes of JSON (a long dimension)."""
    empty = event(dimensions={"pad": ""})
    return event(dimensions={"pad": "x" * (size - len(empty.encode()))})


def _nested(levels: int) -> str:
    """An event whose dimensions are ``levels`` objects nested (the dimensions object first)."""
    inner = "1"
    for _ in range(levels):
        inner = '{"a": ' + inner + "}"
    return raw(event(dimensions=None)[:-1] + ', "dimensions": ' + inner + "}")


BASE = event()[:-1]  # the valid event's text without its closing brace

#: (case, JSON text, accepted by both).
CASES: list[tuple[str, str, bool]] = [
    ("valid", event(), True),
    ("integer and float quantities", event(quantity=0), True),
    ("fractional quantity", event(quantity=1.5), True),
    (
        "quantity 1e15 (repr switches form at 1e16)",
        raw(BASE.replace('"quantity": 1', '"quantity": 1e15') + "}"),
        True,
    ),
    ("quantity 1e16", raw(BASE.replace('"quantity": 1', '"quantity": 1E+16') + "}"), True),
    ("quantity 1e-5", raw(BASE.replace('"quantity": 1', '"quantity": 0.00001') + "}"), True),
    (
        "quantity underflows to zero",
        raw(BASE.replace('"quantity": 1', '"quantity": 1e-400') + "}"),
        True,
    ),
    ("quantity negative zero", raw(BASE.replace('"quantity": 1', '"quantity": -0.0') + "}"), True),
    (
        "tiny negative quantity underflows to -0.0",
        raw(BASE.replace('"quantity": 1', '"quantity": -1e-400') + "}"),
        True,
    ),
    (
        "largest float quantity",
        raw(BASE.replace('"quantity": 1', '"quantity": 1.7976931348623157e308') + "}"),
        True,
    ),
    ("big integer quantity", event(quantity=10**20), True),
    ("meter and workspace trimmed", event(meter=" api.calls\u3000", workspace_id="\tw1 "), True),
    ("meter keeps what pydantic does not trim", event(meter="\x1capi"), True),
    ("meter of 200 characters", event(meter="é" * 200), True),
    (
        "meter with an emoji (a surrogate pair)",
        raw(BASE.replace('"api.calls"', '"api \\ud83d\\ude00"') + "}"),
        True,
    ),
    (
        "meter with an escaped backslash before u0000",
        raw(BASE.replace('"api.calls"', '"a\\\\u0000"') + "}"),
        True,
    ),
    ("id lower case with spaces", event(id=" 01arz3ndektsv4rrffq69g5fav "), True),
    ("id whose long s capitalises to S", event(id="01ARZ3NDEKTSV4RRFFQ69G5FA\u017f"), True),
    ("id null is generated", event(id=None)[:-1] + ', "id": null}', True),
    (
        "occurred_at lower case t and z, 7 digits",
        event(occurred_at="2024-05-01t12:00:00.1234567z"),
        True,
    ),
    ("occurred_at space and -00:00", event(occurred_at=" 2024-05-01 12:00:00-00:00 "), True),
    ("occurred_at offset minutes past 59", event(occurred_at="2024-05-01T12:00:00+05:75"), True),
    ("occurred_at leap day", event(occurred_at="2024-02-29T23:59:59.5+23:59"), True),
    ("occurred_at first instant", event(occurred_at="0001-01-01T00:00:00-01:00"), True),
    ("occurred_at last second", event(occurred_at="9999-12-31T23:59:59+01:00"), True),
    ("dimensions nested", event(dimensions={"a": {"b": [1, "x", None, True, 2.5]}}), True),
    ("dimensions empty", event(dimensions={}), True),
    ("dimensions null", raw(BASE + ', "dimensions": null}'), True),
    (
        "dimension keys trimmed, the later wins",
        raw(BASE + ', "dimensions": {"k": 1, " k ": 2}}'),
        True,
    ),
    ("dimensions 32 objects deep", _nested(32), True),
    (
        "dimension integer of 4300 digits",
        raw(BASE + ', "dimensions": {"n": ' + "9" * 4300 + "}}"),
        True,
    ),
    ("exactly 1 MiB", _padded(MIB), True),
    # Refused by both.
    ("not an object: array", raw("[]"), False),
    ("not an object: string", raw('"x"'), False),
    ("not an object: null", raw("null"), False),
    ("duplicate top-level key", raw(BASE + ', "meter": "again"}'), False),
    ("duplicate key in dimensions", raw(BASE + ', "dimensions": {"a": {"b": 1, "b": 2}}}'), False),
    ("unknown field", event(extra=1), False),
    ("meter missing", raw(BASE.replace('"meter": "api.calls", ', "") + "}"), False),
    ("meter null", raw(BASE.replace('"meter": "api.calls"', '"meter": null') + "}"), False),
    ("meter a number", event(meter=5), False),
    ("meter empty", event(meter=""), False),
    ("meter only whitespace", event(meter=" \u2003 "), False),
    ("meter of 201 characters", event(meter="m" * 201), False),
    ("meter with NUL", raw(BASE.replace('"api.calls"', '"api\\u0000"') + "}"), False),
    ("meter with a lone surrogate", raw(BASE.replace('"api.calls"', '"api\\ud800"') + "}"), False),
    ("workspace_id missing", raw(BASE.replace(', "workspace_id": "w1"', "") + "}"), False),
    ("workspace_id a list", event(workspace_id=["w"]), False),
    ("quantity missing", raw(BASE.replace('"quantity": 1, ', "") + "}"), False),
    ("quantity a string", event(quantity="1"), False),
    ("quantity a bool", event(quantity=True), False),
    ("quantity negative", event(quantity=-1), False),
    (
        "quantity overflows a float",
        raw(BASE.replace('"quantity": 1', '"quantity": 1e400') + "}"),
        False,
    ),
    (
        "quantity just past the largest float",
        raw(BASE.replace('"quantity": 1', '"quantity": 1.7976931348623159e308') + "}"),
        False,
    ),
    (
        "quantity integer too large for a float",
        raw(BASE.replace('"quantity": 1', '"quantity": ' + "9" * 400) + "}"),
        False,
    ),
    ("id too short", event(id=ID[:-1]), False),
    ("id with U", event(id="01ARZ3NDEKTSV4RRFFQ69G5FAU"), False),
    ("id starting past 7", event(id="81ARZ3NDEKTSV4RRFFQ69G5FAV"), False),
    ("id a number", event(id=123), False),
    ("id whose sharp s capitalises to SS", event(id="01ARZ3NDEKTSV4RRFFQ69G5FA\u00df"), False),
    ("occurred_at without offset", event(occurred_at="2024-05-01T12:00:00"), False),
    ("occurred_at 30 February", event(occurred_at="2024-02-30T12:00:00Z"), False),
    ("occurred_at hour 24", event(occurred_at="2024-05-01T24:00:00Z"), False),
    ("occurred_at second 60", event(occurred_at="2024-05-01T12:00:60Z"), False),
    ("occurred_at offset 24 hours", event(occurred_at="2024-05-01T12:00:00+24:00"), False),
    ("occurred_at offset 23:60", event(occurred_at="2024-05-01T12:00:00+23:60"), False),
    ("occurred_at year 0", event(occurred_at="0000-01-01T00:00:00Z"), False),
    ("occurred_at before year 1 in UTC", event(occurred_at="0001-01-01T00:00:00+01:00"), False),
    ("occurred_at after 9999 in UTC", event(occurred_at="9999-12-31T23:59:59-01:00"), False),
    ("occurred_at 10 fraction digits", event(occurred_at="2024-05-01T12:00:00.1234567890Z"), False),
    (
        "occurred_at Arabic-Indic digits",
        event(occurred_at="\u0662\u0660\u0662\u0664-05-01T12:00:00Z"),
        False,
    ),
    ("occurred_at a number", event(occurred_at=1714564800), False),
    (
        "occurred_at NUL",
        event(occurred_at=None)[:-1] + ', "occurred_at": "2024-05-01T12:00:00Z\\u0000"}',
        False,
    ),
    ("dimensions a list", event(dimensions=[1]), False),
    ("dimensions a string", event(dimensions="x"), False),
    ("dimensions 33 objects deep", _nested(33), False),
    ("dimension value with NUL", raw(BASE + ', "dimensions": {"a": ["x\\u0000"]}}'), False),
    ("dimension key with NUL", raw(BASE + ', "dimensions": {"a\\u0000": 1}}'), False),
    ("dimension with a lone low surrogate", raw(BASE + ', "dimensions": {"a": "\\udc00"}}'), False),
    (
        "a lone high surrogate before a pair",
        raw(BASE + ', "dimensions": {"a": "\\ud800\\ud800\\udc00"}}'),
        False,
    ),
    (
        "a low surrogate after an escaped backslash",
        raw(BASE.replace('"api.calls"', '"a\\\\ud800\\udc00"') + "}"),
        False,
    ),
    ("dimension float overflows", raw(BASE + ', "dimensions": {"a": -1e400}}'), False),
    (
        "dimension integer of 4301 digits",
        raw(BASE + ', "dimensions": {"n": ' + "9" * 4301 + "}}"),
        False,
    ),
    ("one byte over 1 MiB", _padded(MIB + 1), False),
]


@pytest.fixture
async def ingest(pool: asyncpg.Pool, db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """The api process's HTTP app in process, over this test's database, with a usage queue
    whose retry budget is the sender's default (so both paths store the same options)."""
    await make_queue(pool, "usage-events", retry_limit=10, retry_delay=30, retry_backoff=True)
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None, database_url=db_url, service_role="api", ingest_token=TOKEN
    )
    state = ServiceState(settings=settings, pool=pool, sender=Sender(pool), not_ready_reason=None)
    transport = httpx.ASGITransport(app=create_app(state))
    async with httpx.AsyncClient(transport=transport, base_url="http://ingest") as client:
        yield client


async def post(client: httpx.AsyncClient, text: str) -> httpx.Response:
    return await client.post(
        "/v1/usage-events",
        content=text.encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )


async def stored(pool: asyncpg.Pool) -> list[tuple[Any, ...]]:
    rows = await pool.fetch(
        "SELECT data::text, singleton_key, retry_limit, retry_delay, retry_backoff, priority"
        " FROM jobs.job WHERE queue = 'usage-events' ORDER BY id"
    )
    return [tuple(r.values()) for r in rows]


@pytest.mark.parametrize(("case", "text", "accepted"), CASES, ids=[c[0] for c in CASES])
async def test_emit_usage_refuses_exactly_what_the_http_ingest_refuses(
    ingest: httpx.AsyncClient, pool: asyncpg.Pool, case: str, text: str, accepted: bool
) -> None:
    """The same JSON text through both: both accept and store the same job, or both refuse
    (HTTP 400/413, SQLSTATE 22023 naming a field) and store nothing."""
    response = await post(ingest, text)
    try:
        event_id = await pool.fetchval("SELECT jobs.emit_usage($1::text::json)", text)
        sql_error: asyncpg.PostgresError | None = None
    except asyncpg.PostgresError as exc:
        sql_error = exc
    if accepted:
        assert response.status_code == 202, response.text
        assert sql_error is None, sql_error
        jobs = await stored(pool)
        assert len(jobs) == 2
        if "id null" in case:  # each path generated its own id: compare the rest
            (http_id,) = response.json()["ids"]
            assert [job[1] for job in jobs] == [http_id, event_id]
            jobs = [(json.loads(job[0]) | {"id": None}, *job[2:]) for job in jobs]
        else:
            assert response.json()["ids"] == [event_id]
        assert jobs[0] == jobs[1]
    else:
        assert response.status_code in (400, 413), response.text
        assert sql_error is not None, f"emit_usage accepted what the ingest refused: {case}"
        assert sql_error.sqlstate == "22023", sql_error
        assert sql_error.column_name
        assert await stored(pool) == []


async def test_an_absent_occurred_at_is_now_in_sql_and_refused_over_http(
    ingest: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    """The contract's one difference: HTTP requires occurred_at; the function, like Python,
    takes an absent or null one as now() (in UTC, as datetime.isoformat writes it)."""
    for text in (event(occurred_at=None), event(occurred_at=None)[:-1] + ', "occurred_at": null}'):
        assert (await post(ingest, text)).status_code == 400
        async with pool.acquire() as conn, conn.transaction():
            await conn.fetchval("SELECT jobs.emit_usage($1::text::json)", text)
            written, now = await conn.fetchrow(
                "SELECT data->>'occurred_at', now() FROM jobs.job ORDER BY id DESC LIMIT 1"
            )
        assert written.endswith("+00:00")
        assert written == now.isoformat()


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (raw(BASE.replace('"api.calls"', '"api\\u0000"') + "}"), "meter"),
        (raw(BASE.replace('"w1"', '"w\\ud800"') + "}"), "workspace_id"),
        (raw(BASE + ', "dimensions": {"a": [1, "x\\u0000"]}}'), "dimensions.a.1"),
        (raw(BASE + ', "dimensions": {"a": {"b": "\\udc00"}}}'), "dimensions.a.b"),
        (raw(BASE + ', "dimensions": {"a": {"b": 1e400}}}'), "dimensions.a.b"),
        (_nested(33), "dimensions" + ".a" * 32),
        (raw(BASE + ', "meter": "again"}'), "meter"),
        (event(quantity=-1), "quantity"),
        (event(occurred_at="2024-02-30T00:00:00Z"), "occurred_at"),
        (event(id="x"), "id"),
        (event(extra=1), "extra"),
    ],
)
async def test_the_error_names_the_field(ingest: httpx.AsyncClient, pool, text, field) -> None:
    """The 22023 error's column field names the field at fault (a path inside dimensions), as
    the ingest's 400 does."""
    with pytest.raises(asyncpg.PostgresError) as caught:
        await pool.fetchval("SELECT jobs.emit_usage($1::text::json)", text)
    assert caught.value.sqlstate == "22023"
    assert caught.value.column_name == field
    assert field.split(".")[-1] in caught.value.message
