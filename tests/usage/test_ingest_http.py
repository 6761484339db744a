"""The /v1 HTTP surface of a real api process: auth, limits, validation, all-or-nothing, jobs
and timers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import httpx
import pytest

from api_sender import new_ulid
from tests.support.dbproxy import DatabaseProxy
from tests.support.postgres import installed_database
from tests.support.processes import Daemon, free_port, start_daemon
from tests.support.queues import make_queue
from tests.support.rawhttp import exchange, request_head
from tests.usage.conftest import FAST_USAGE, TOKEN, fetch, ingest, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("usage-ingest")]

#: A queue name the name check allows that holds a slash (issue 28 item 11).
SLASHED = "team/reports"


@pytest.fixture(scope="module")
def shared_db(admin_url: str, template_name: str) -> Iterator[str]:
    """One installed database for this module, with a tool queue and a short-policy queue."""

    async def queues(pool: asyncpg.Pool) -> None:
        await make_queue(pool, "reports")
        await make_queue(pool, "once", policy="short")
        await make_queue(pool, SLASHED)

    with installed_database(admin_url, template_name, queues) as url:
        yield url


@pytest.fixture(scope="module")
def api(shared_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """An api-role process (no worker: what is enqueued stays visible) with USAGE_RETRY_LIMIT=4."""
    daemon = start_daemon(
        shared_db,
        tmp_path_factory.mktemp("api"),
        role="api",
        env={**FAST_USAGE, "USAGE_RETRY_LIMIT": "4", "USAGE_RETRY_DELAY_SECONDS": "7"},
    )
    try:
        daemon.wait_ready(60)
        yield daemon
    finally:
        daemon.stop()


def _event(**extra: object) -> dict[str, object]:
    return {"meter": "api.calls", "quantity": 1, "workspace_id": "w1", **extra} | {
        "occurred_at": extra.get("occurred_at", "2024-05-01T12:00:00Z")
    }


def _stored(url: str, ids: list[str]) -> list[asyncpg.Record]:
    return fetch(
        url,
        "SELECT data->>'id' AS id, singleton_key, retry_limit, retry_delay, retry_backoff "
        "FROM jobs.job WHERE data->>'id' = ANY($1::text[]) ORDER BY id",
        ids,
    )


def test_one_event_is_accepted_and_enqueued_with_usage_options(api: Daemon, shared_db: str) -> None:
    """A single event answers 202 with its generated id; the job carries the usage options."""
    response = ingest(api, _event())
    assert response.status_code == 202
    body = response.json()
    assert body["accepted"] == 1
    (event_id,) = body["ids"]
    rows = _stored(shared_db, [event_id])
    assert [tuple(r.values()) for r in rows] == [(event_id, event_id, 4, 7, True)]


def test_a_batch_keeps_given_ids_in_order(api: Daemon, shared_db: str) -> None:
    """{"events": [...]} of 1000 answers every id in order, given ids kept, all stored."""
    given = new_ulid()
    events = [_event(id=given), *(_event(quantity=i) for i in range(999))]
    response = ingest(api, {"events": events})
    assert response.status_code == 202
    ids = response.json()["ids"]
    assert len(ids) == 1000
    assert ids[0] == given
    assert len(_stored(shared_db, ids)) == 1000


def test_one_invalid_event_refuses_the_whole_batch(api: Daemon, shared_db: str) -> None:
    """A batch with one bad event answers 400 naming index and field; nothing is enqueued."""
    ids = [new_ulid() for _ in range(5)]
    events = [_event(id=i) for i in ids]
    events[3]["quantity"] = -1
    events[4]["occurred_at"] = "2024-05-01T12:00:00"
    response = ingest(api, {"events": events})
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert {(e["index"], e["field"]) for e in errors} == {(3, "quantity"), (4, "occurred_at")}
    assert _stored(shared_db, ids) == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"events": []}, "events"),
        ({"events": [_event()] * 1001}, "events"),
        ({"events": "x"}, "events"),
        ({"events": [_event()], "extra": 1}, "extra"),
        (_event(colour="red"), "colour"),
        ({"events": [1]}, "(event)"),
    ],
)
def test_malformed_bodies_answer_400_with_the_field(api: Daemon, body: object, field: str) -> None:
    """Empty, oversized, non-list batches, unknown fields and non-objects are named in the 400."""
    response = ingest(api, body)
    assert response.status_code == 400
    assert field in {e["field"] for e in response.json()["errors"]}


def test_the_same_id_twice_is_refused(api: Daemon) -> None:
    """Two events with one id in one request answer 400 on the second."""
    same = new_ulid()
    response = ingest(api, {"events": [_event(id=same), _event(id=same)]})
    assert response.status_code == 400
    assert response.json()["errors"] == [
        {"field": "id", "message": "the same id appears twice in this request", "index": 1}
    ]


@pytest.mark.parametrize("raw", [b"{nope", b"[1, 2]", b'{"meter": NaN}', b""])
def test_non_json_and_non_objects_answer_400(api: Daemon, raw: bytes) -> None:
    """Invalid JSON, NaN, an array or an empty body answer 400."""
    response = httpx.post(
        api.url("/v1/usage-events"),
        content=raw,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    assert response.status_code == 400


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}],
)
def test_missing_or_wrong_token_answers_401(api: Daemon, headers: dict[str, str]) -> None:
    """No token, a wrong one or another scheme answer 401 on every /v1 route."""
    for method, path in [
        ("POST", "/v1/usage-events"),
        ("POST", "/v1/jobs/reports"),
        ("DELETE", "/v1/timers/reports/k"),
        ("GET", "/v1/nothing-here"),
    ]:
        response = httpx.request(method, api.url(path), headers=headers, json=_event())
        assert response.status_code == 401, (method, path)


def test_a_body_over_1_mib_is_413_by_header(api: Daemon) -> None:
    """A declared Content-Length above 1 MiB answers 413 before the body is read."""
    raw = b'{"events": [' + b" " * (1 << 20) + b"]}"
    response = httpx.post(
        api.url("/v1/usage-events"),
        content=raw,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    assert response.status_code == 413


def test_a_chunked_body_over_1_mib_is_413_while_reading(api: Daemon) -> None:
    """A body without Content-Length is cut off at 1 MiB read and answers 413."""

    def chunks() -> Iterator[bytes]:
        yield b'{"events": ['
        for _ in range(40):
            yield b" " * 32768

    response = httpx.post(
        api.url("/v1/usage-events"),
        content=chunks(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    assert response.status_code == 413


def test_post_job_answers_202_404_400_409(api: Daemon, shared_db: str) -> None:
    """A job on an installed queue is stored; unknown queues 404; bad fields 400; a refused
    singleton key 409."""
    response = ingest(
        api,
        {"data": {"r": 1}, "start_after_seconds": 60, "singleton_key": "k", "priority": 5},
        path="/v1/jobs/reports",
    )
    assert response.status_code == 202
    job_id = response.json()["id"]
    row = fetch(
        shared_db,
        "SELECT data, singleton_key, priority, start_after > now() AS later FROM jobs.job "
        "WHERE id = $1",
        job_id,
    )[0]
    assert (json.loads(row["data"]), row["singleton_key"], row["priority"], row["later"]) == (
        {"r": 1},
        "k",
        5,
        True,
    )
    assert ingest(api, {"data": {}}, path="/v1/jobs/nope").status_code == 404
    for bad in ({"data": 1}, {"data": {}, "priority": "high"}, {"data": {}, "x": 1}, {}):
        assert ingest(api, bad, path="/v1/jobs/reports").status_code == 400, bad
    assert ingest(api, {"data": {}}, path="/v1/jobs/usage-events").status_code == 400
    first = ingest(api, {"data": {}, "singleton_key": "one"}, path="/v1/jobs/once")
    assert first.status_code == 202
    again = ingest(api, {"data": {}, "singleton_key": "one"}, path="/v1/jobs/once")
    assert again.status_code == 409


def test_timers_schedule_replace_and_cancel(api: Daemon, shared_db: str) -> None:
    """A keyed timer replaces the pending one; DELETE cancels it (204), then finds none (404)."""
    at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    first = ingest(api, {"at": at, "data": {"n": 1}, "key": "t1"}, path="/v1/timers/reports")
    second = ingest(
        api, {"delay_seconds": 30, "data": {"n": 2}, "key": "t1"}, path="/v1/timers/reports"
    )
    assert (first.status_code, second.status_code) == (202, 202)
    states = fetch(
        shared_db,
        "SELECT id, state::text FROM jobs.job WHERE id = ANY($1::bigint[]) ORDER BY id",
        [first.json()["id"], second.json()["id"]],
    )
    assert [s["state"] for s in states] == ["cancelled", "created"]
    headers = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.delete(api.url("/v1/timers/reports/t1"), headers=headers).status_code == 204
    assert httpx.delete(api.url("/v1/timers/reports/t1"), headers=headers).status_code == 404
    for bad in (
        {"at": "2030-01-01T00:00:00"},
        {"at": at, "delay_seconds": 1},
        {},
        {"delay_seconds": -1},
    ):
        assert ingest(api, bad, path="/v1/timers/reports").status_code == 400, bad
    assert ingest(api, {"delay_seconds": 1}, path="/v1/timers/nope").status_code == 404


def test_unset_token_answers_403_everywhere(shared_db: str, tmp_path: Path) -> None:
    """Without INGEST_TOKEN every /v1 request answers 403 ingest disabled, token or not."""
    env = {k: v for k, v in FAST_USAGE.items() if k != "INGEST_TOKEN"}
    daemon = start_daemon(shared_db, tmp_path, role="api", env=env)
    try:
        daemon.wait_ready(60)
        for path in ("/v1/usage-events", "/v1/jobs/reports", "/v1/anything"):
            response = ingest(daemon, _event(), path=path)
            assert response.status_code == 403
            assert response.json() == {"error": "ingest disabled"}
    finally:
        daemon.stop()


def test_a_worker_process_answers_404_on_v1(shared_db: str, tmp_path: Path) -> None:
    """The worker role serves no ingest: /v1 is 404 even with the token."""
    daemon = start_daemon(shared_db, tmp_path, role="worker", env=FAST_USAGE)
    try:
        daemon.wait_ready(60)
        assert ingest(daemon, _event()).status_code == 404
    finally:
        daemon.stop()


def test_database_down_answers_503_and_enqueues_nothing(shared_db: str, tmp_path: Path) -> None:
    """With the database cut off, ingest answers 503 and stores nothing; once it is back, 202."""
    proxy = DatabaseProxy(shared_db)
    daemon = start_daemon(proxy.url, tmp_path, role="api", env=FAST_USAGE)
    try:
        daemon.wait_ready(60)
        proxy.cut()
        ids = [new_ulid() for _ in range(3)]
        response = ingest(daemon, {"events": [_event(id=i) for i in ids]})
        assert response.status_code == 503
        assert response.json()["error"] == "database unreachable"
        proxy.restore()
        assert _stored(shared_db, ids) == []
        assert ingest(daemon, {"events": [_event(id=i) for i in ids]}).status_code == 202
        assert len(_stored(shared_db, ids)) == 3
    finally:
        daemon.stop()
        proxy.close()


def test_database_unreachable_at_boot_answers_503(tmp_path: Path) -> None:
    """An api process whose database never answered yet refuses ingest with 503."""
    dead = f"postgresql://postgres@127.0.0.1:{free_port()}/none"
    daemon = start_daemon(dead, tmp_path, role="api", env=FAST_USAGE)
    try:
        wait_until(lambda: daemon.get("/healthz")[0] == 200, 30, "/healthz")
        assert ingest(daemon, _event()).status_code == 503
    finally:
        daemon.stop()


# --- Hostile input (issue 10, C14) -------------------------------------------------------------


def _raw(
    api: Daemon, path: str, body: bytes | str, content_type: str | None = None
) -> httpx.Response:
    """POST raw bytes with the token and (unless None) a JSON content type."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    raw = body.encode() if isinstance(body, str) else body
    return httpx.post(api.url(path), content=raw, headers=headers, timeout=15)


def _json(api: Daemon, path: str, body: bytes | str) -> httpx.Response:
    return _raw(api, path, body, "application/json")


def _fields(response: httpx.Response) -> set[str]:
    return {e["field"] for e in response.json().get("errors", [])}


def _count(url: str, queue: str) -> int:
    return int(fetch(url, "SELECT count(*) FROM jobs.job WHERE queue = $1", queue)[0][0])


def _event_text(**fields: str) -> str:
    """One event as JSON text; ``fields`` are raw JSON snippets (escapes stay escapes)."""
    parts = {
        "meter": '"api.calls"',
        "quantity": "1",
        "workspace_id": '"w1"',
        "occurred_at": '"2024-05-01T12:00:00Z"',
        **fields,
    }
    return "{" + ", ".join(f'"{k}": {v}' for k, v in parts.items()) + "}"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"meter": r'"api\u0000calls"'}, "meter"),
        ({"meter": r'"\ud800"'}, "meter"),
        ({"workspace_id": r'"w\u0000"'}, "workspace_id"),
        ({"workspace_id": r'"w\udfff"'}, "workspace_id"),
        ({"dimensions": r'{"region": "eu\u0000"}'}, "dimensions"),
        ({"dimensions": r'{"region\u0000": "eu"}'}, "dimensions"),
        ({"dimensions": r'{"region": ["\ud800"]}'}, "dimensions"),
        ({"dimensions": '{"big": 1e400}'}, "dimensions"),
        ({"quantity": "1e400"}, "quantity"),
        ({"occurred_at": '"9999-12-31T23:59:59-01:00"'}, "occurred_at"),
        ({"occurred_at": '"0001-01-01T00:00:00+01:00"'}, "occurred_at"),
    ],
)
def test_unstorable_event_fields_answer_400_naming_them(
    api: Daemon, shared_db: str, fields: dict[str, str], field: str
) -> None:
    """NUL, lone surrogates, 1e400 and instants outside years 1-9999 in an event answer 400
    naming the field (never a 500), and nothing is enqueued."""
    event_id = new_ulid()
    response = _json(api, "/v1/usage-events", _event_text(id=f'"{event_id}"', **fields))
    assert response.status_code == 400, response.text
    assert field in _fields(response), response.text
    assert _stored(shared_db, [event_id]) == []


def test_an_event_without_occurred_at_is_refused(api: Daemon, shared_db: str) -> None:
    """occurred_at is required on HTTP (contract section 4): 400 naming it, nothing enqueued."""
    event_id = new_ulid()
    body = {"id": event_id, "meter": "api.calls", "quantity": 1, "workspace_id": "w1"}
    response = ingest(api, {"events": [_event(), body]})
    assert response.status_code == 400
    assert [(e["index"], e["field"]) for e in response.json()["errors"]] == [(1, "occurred_at")]
    assert _stored(shared_db, [event_id]) == []


def test_duplicate_keys_are_refused_not_last_one_wins(api: Daemon, shared_db: str) -> None:
    """An object with one key twice ("quantity": 1, ..., "quantity": 1000) answers 400 naming
    the key; nothing is enqueued (last-one-wins would bill 1000)."""
    event_id = new_ulid()
    text = _event_text(id=f'"{event_id}"', quantity="1")[:-1] + ', "quantity": 1000}'
    response = _json(api, "/v1/usage-events", text)
    assert response.status_code == 400, response.text
    assert "quantity" in _fields(response)
    assert _stored(shared_db, [event_id]) == []
    nested = _json(api, "/v1/jobs/reports", '{"data": {"a": 1, "a": 2}}')
    assert nested.status_code == 400
    assert "a" in _fields(nested)


@pytest.mark.parametrize("depth", [100, 965, 969, 5000])
def test_deep_nesting_answers_400_naming_the_limit(api: Daemon, shared_db: str, depth: int) -> None:
    """JSON nested past the limit answers 400 that names the nesting (not a RecursionError
    500); nothing is enqueued."""
    before = _count(shared_db, "reports")
    body = '{"data": ' + '{"a": ' * depth + "1" + "}" * depth + "}"
    response = _json(api, "/v1/jobs/reports", body)
    assert response.status_code == 400, response.text
    assert "nest" in response.text
    assert _count(shared_db, "reports") == before


def test_nesting_within_the_limit_is_accepted(api: Daemon) -> None:
    """Data nested 60 levels deep is an ordinary job."""
    body = '{"data": ' + '{"a": ' * 60 + "1" + "}" * 60 + "}"
    assert _json(api, "/v1/jobs/reports", body).status_code == 202


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (r'{"data": {"x": "a\u0000b"}}', "data.x"),
        (r'{"data": {"x\u0000": 1}}', "data.x\\u0000"),
        (r'{"data": {"x": ["\ud800"]}}', "data.x.0"),
        ('{"data": {"x": 1e400}}', "data.x"),
        (r'{"data": {}, "singleton_key": "k\u0000"}', "singleton_key"),
        (r'{"data": {}, "singleton_key": "\udbff"}', "singleton_key"),
        ('{"data": {}, "start_after_seconds": 1e13}', "start_after_seconds"),
        ('{"data": {}, "start_after_seconds": 1e308}', "start_after_seconds"),
        ('{"data": {}, "start_after_seconds": 1e400}', "start_after_seconds"),
        ('{"data": {}, "start_after_seconds": "5"}', "start_after_seconds"),
        ('{"data": {}, "start_after_seconds": true}', "start_after_seconds"),
        ('{"data": {}, "priority": 1.5}', "priority"),
    ],
)
def test_unstorable_job_fields_answer_400_naming_them(
    api: Daemon, shared_db: str, body: str, field: str
) -> None:
    """NUL, lone surrogates, 1e400, delays past 100 years and non-numbers in a job answer 400
    naming the field; nothing is enqueued."""
    before = _count(shared_db, "reports")
    response = _json(api, "/v1/jobs/reports", body)
    assert response.status_code == 400, response.text
    assert field in _fields(response), response.text
    assert _count(shared_db, "reports") == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"delay_seconds": 1e13}', "delay_seconds"),
        ('{"delay_seconds": 1e308}', "delay_seconds"),
        ('{"delay_seconds": "5"}', "delay_seconds"),
        ('{"delay_seconds": false}', "delay_seconds"),
        ('{"at": "9999-12-31T23:59:59-01:00"}', "at"),
        ('{"at": "0001-01-01T00:00:00+01:00"}', "at"),
        (r'{"delay_seconds": 1, "key": "k\u0000"}', "key"),
        (r'{"delay_seconds": 1, "key": "\ud800"}', "key"),
        (r'{"delay_seconds": 1, "data": {"n": "\u0000"}}', "data.n"),
    ],
)
def test_unstorable_timer_fields_answer_400_naming_them(
    api: Daemon, shared_db: str, body: str, field: str
) -> None:
    """Out-of-range instants and delays, non-numbers, NUL and surrogates in a timer answer 400
    naming the field; nothing is enqueued."""
    before = _count(shared_db, "reports")
    response = _json(api, "/v1/timers/reports", body)
    assert response.status_code == 400, response.text
    assert field in _fields(response), response.text
    assert _count(shared_db, "reports") == before


def test_a_nul_in_the_queue_name_answers_400(api: Daemon) -> None:
    """%00 in the queue of a job, timer or timer cancel answers 400 naming the queue."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for response in (
        _json(api, "/v1/jobs/re%00ports", '{"data": {}}'),
        _json(api, "/v1/timers/re%00ports", '{"delay_seconds": 1}'),
        httpx.delete(api.url("/v1/timers/re%00ports/k"), headers=headers),
        httpx.delete(api.url("/v1/timers/reports/k%00"), headers=headers),
    ):
        assert response.status_code == 400, response.text
        assert _fields(response) & {"queue", "key"}, response.text


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin-1",
        "application/jsonx",
    ],
)
def test_a_body_that_is_not_application_json_answers_415(
    api: Daemon, shared_db: str, content_type: str | None
) -> None:
    """Only application/json (UTF-8) is read: any other or no Content-Type answers 415 and
    enqueues nothing, on every /v1 POST."""
    event_id = new_ulid()
    before = _count(shared_db, "reports")
    for path, body in (
        ("/v1/usage-events", _event_text(id=f'"{event_id}"')),
        ("/v1/jobs/reports", '{"data": {}}'),
        ("/v1/timers/reports", '{"delay_seconds": 1}'),
    ):
        response = _raw(api, path, body, content_type)
        assert response.status_code == 415, (path, response.text)
        assert "Content-Type" in _fields(response)
    assert _stored(shared_db, [event_id]) == []
    assert _count(shared_db, "reports") == before


@pytest.mark.parametrize(
    "content_type", ["application/json; charset=utf-8", 'Application/JSON; charset="UTF-8"']
)
def test_application_json_with_utf8_charset_is_accepted(api: Daemon, content_type: str) -> None:
    """application/json with a UTF-8 charset, any case, is an ordinary request."""
    response = _raw(api, "/v1/usage-events", _event_text(), content_type)
    assert response.status_code == 202, response.text


def test_a_body_that_is_not_utf8_answers_400(api: Daemon, shared_db: str) -> None:
    """A body in another encoding (UTF-16 here) answers 400 naming the encoding; a UTF-8 byte
    order mark (not JSON) is refused too; nothing is enqueued."""
    event_id = new_ulid()
    text = _event_text(id=f'"{event_id}"')
    response = _json(api, "/v1/usage-events", text.encode("utf-16"))
    assert response.status_code == 400
    assert "UTF-8" in response.json()["error"]
    assert _json(api, "/v1/usage-events", b"\xef\xbb\xbf" + text.encode()).status_code == 400
    assert _stored(shared_db, [event_id]) == []


def test_errors_do_not_echo_huge_or_secret_input(api: Daemon) -> None:
    """A 200,000-character unknown key or a token-looking value is not quoted back whole."""
    key = "k" * 200_000
    response = _json(api, "/v1/usage-events", _event_text(**{key: "1"}))
    assert response.status_code == 400
    assert len(response.text) < 2_000
    secret = "sk_live_" + "x" * 40
    response = _json(api, "/v1/jobs/reports", f'{{"data": {{}}, "priority": "{secret}"}}')
    assert response.status_code == 400
    assert secret not in response.text


# --- Issue 28 item 8: chunk sizes past the limit, obsolete line folding -------------------------


def _chunked_head(path: str = "/v1/jobs/reports") -> bytes:
    headers = {
        "Authorization": f"Bearer {TOKEN}",
        "Content-Type": "application/json",
        "Transfer-Encoding": "chunked",
    }
    return request_head("POST", path, headers)


@pytest.mark.parametrize(
    "size", [(1 << 20) + 1, 2**21, 2**60, 2**80, 2**400], ids=lambda n: f"{n:x}"[:24]
)
def test_a_chunk_announced_past_1_mib_answers_413_at_once(
    api: Daemon, shared_db: str, size: int
) -> None:
    """A chunked body whose first chunk is announced above 1 MiB (up to 2^400 bytes, far past
    what the parser's own 20 hex digits allow) answers 413 naming the limit at once, without
    waiting for the body, and enqueues nothing."""
    before = _count(shared_db, "reports")
    answer = exchange(api.port, [_chunked_head() + f"{size:x}\r\n{{".encode()], timeout=20)
    assert answer.status == 413, (answer.status, answer.body[:300], answer.hung)
    assert answer.seconds < 2, answer.seconds
    assert "too large" in answer.body.decode()
    assert answer.json()["limit_bytes"] == 1 << 20
    assert _count(shared_db, "reports") == before


def test_chunks_announced_past_1_mib_in_all_answer_413_before_the_last_arrives(
    api: Daemon, shared_db: str
) -> None:
    """Two chunks of 600 KiB: once the second is announced the body cannot fit 1 MiB, so it
    answers 413 at once rather than when its bytes (never sent) would have come."""
    before = _count(shared_db, "reports")
    first = b'{"data": "' + b"x" * (600 * 1024 - 10)
    raw = _chunked_head() + f"{len(first):x}\r\n".encode() + first + b"\r\n"
    answer = exchange(api.port, [raw + f"{600 * 1024:x}\r\nxx".encode()], timeout=20)
    assert answer.status == 413, (answer.status, answer.body[:300], answer.hung)
    assert answer.seconds < 2, answer.seconds
    assert _count(shared_db, "reports") == before


def test_chunked_bodies_within_1_mib_are_still_read(api: Daemon, shared_db: str) -> None:
    """Many small chunks, chunk extensions and upper-case hex, 1 MiB in all at most, are an
    ordinary request (202)."""
    body = b'{"data": {"pad": "' + b"p" * 200_000 + b'"}}'
    parts = [body[i : i + 7001] for i in range(0, len(body), 7001)]
    framed = b"".join(f"{len(p):X};ext=1\r\n".encode() + p + b"\r\n" for p in parts)
    answer = exchange(api.port, [_chunked_head() + framed + b"0\r\n\r\n"], timeout=20)
    assert answer.status == 202, answer.body[:300]


@pytest.mark.parametrize(
    ("head", "continuation"),
    [
        (b"Content-Type: application/json", b" extra"),
        (b"X-Note: one", b"\ttwo"),
        (b"Authorization: Bearer " + TOKEN.encode(), b" more"),
    ],
    ids=["content-type-space", "other-tab", "authorization"],
)
def test_an_obs_fold_header_answers_400_naming_it(
    api: Daemon, shared_db: str, head: bytes, continuation: bytes
) -> None:
    """A header continued on a line starting with a space or tab (obs-fold, RFC 9112 section
    5.2) answers 400 saying so, whatever the header, and enqueues nothing."""
    before = _count(shared_db, "reports")
    body = b'{"data": {}}'
    lines = [
        b"POST /v1/jobs/reports HTTP/1.1",
        b"Host: 127.0.0.1",
        *(
            line
            for line in (
                b"Authorization: Bearer " + TOKEN.encode(),
                b"Content-Type: application/json",
            )
            if not line.startswith(head.split(b":")[0] + b":")
        ),
        head,
        continuation,
        b"Content-Length: " + str(len(body)).encode(),
    ]
    answer = exchange(api.port, [b"\r\n".join(lines) + b"\r\n\r\n" + body], timeout=20)
    assert answer.status == 400, (answer.status, answer.body[:300])
    assert "folding" in answer.body.decode()
    assert _count(shared_db, "reports") == before


def test_an_obs_fold_on_a_probe_answers_400(api: Daemon) -> None:
    """obs-fold is refused on every path of the listener, /healthz included."""
    raw = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n cont\r\n\r\n"
    assert exchange(api.port, [raw], timeout=10).status == 400


# --- Issue 28 item 11: queue names with a slash -------------------------------------------------


def test_jobs_and_timers_reach_a_queue_whose_name_holds_a_slash(
    api: Daemon, shared_db: str
) -> None:
    """POST /v1/jobs/team%2Freports and /v1/timers/team%2Freports enqueue on queue team/reports
    (the slash sent encoded or not); DELETE /v1/timers/team%2Freports/KEY cancels its timer."""
    encoded = "team%2Freports"
    for path in (f"/v1/jobs/{encoded}", f"/v1/jobs/{SLASHED}"):
        response = ingest(api, {"data": {"via": path}}, path=path)
        assert response.status_code == 202, (path, response.text)
        [row] = fetch(shared_db, "SELECT queue FROM jobs.job WHERE id = $1", response.json()["id"])
        assert row["queue"] == SLASHED
    timer = ingest(api, {"delay_seconds": 600, "key": "a/k"}, path=f"/v1/timers/{encoded}")
    assert timer.status_code == 202, timer.text
    [row] = fetch(shared_db, "SELECT queue FROM jobs.job WHERE id = $1", timer.json()["id"])
    assert row["queue"] == SLASHED
    headers = {"Authorization": f"Bearer {TOKEN}"}
    cancel = httpx.delete(api.url(f"/v1/timers/{encoded}/a/k"), headers=headers)
    assert cancel.status_code == 204, cancel.text
    again = httpx.delete(api.url(f"/v1/timers/{encoded}/a%2Fk"), headers=headers)
    assert again.status_code == 404, again.text
    assert ingest(api, {"data": {}}, path="/v1/jobs/team%2Fnope").status_code == 404
