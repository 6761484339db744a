"""Drill 23: hostile input. Hundreds of malformed, oversized, deeply nested, NUL-bearing, lying
and slow requests against a real api process, beside a steady stream of good ones."""

from __future__ import annotations

import asyncio
import base64
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import pytest

from api_sender import create_pool, new_ulid
from tests.drills.helpers import SCALE, Fleet, fetchval, log_events, sized
from tests.support.processes import run_cli
from tests.support.queues import make_queue
from tests.support.rawhttp import RawAnswer, exchange, request_head

#: One daemon: runs in the second drill lane, beside the multi-process drills.
pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills-light")]

TOKEN = "drill-hostile-token"
ADMIN = "drill-hostile-admin-token"
HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 3.0
#: Bad requests go only here (and to the usage queue): any row in it is a refused request's.
HOSTILE = "drill-hostile"
GOOD = "drill-good"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {**AUTH, "Content-Type": "application/json"}
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}
CONSOLE_AUTH = {"Authorization": "Basic " + base64.b64encode(f"ops:{ADMIN}".encode()).decode()}
#: The console's own origin as these raw requests name it (their Host is 127.0.0.1).
CONSOLE_FORM = {
    **CONSOLE_AUTH,
    "Origin": "http://127.0.0.1",
    "Content-Type": "application/x-www-form-urlencoded",
}
#: How long any one exchange may take before it counts as a hang: the slow cases end after
#: the header or body timeout, everything else at once.
HANG_SECONDS = 20.0


@dataclass
class Case:
    """One hostile request: the bytes (sent with ``pause`` between parts), what it must get."""

    kind: str
    parts: list[bytes]
    #: Statuses that count as the right refusal; ``None`` in it: no answer, the connection
    #: closed (a silent connection, or a client that hangs up itself).
    expect: set[int | None]
    #: Text the answer must contain (case-insensitive): it names the problem.
    names: str | None = None
    pause: float = 0.0
    hang_up: bool = False


@dataclass
class Outcome:
    """What a case got."""

    case: Case
    answer: RawAnswer
    problems: list[str] = field(default_factory=list)


def _post(path: str, body: bytes | str, headers: dict[str, str] | None = None) -> bytes:
    raw = body.encode() if isinstance(body, str) else body
    given = dict(JSON if headers is None else headers)
    given.setdefault("Content-Length", str(len(raw)))
    return request_head("POST", path, given) + raw


def _event(**fields: str) -> str:
    """A usage event as JSON text with raw JSON snippets for ``fields``."""
    parts = {
        "id": f'"{new_ulid()}"',
        "meter": '"api.calls"',
        "quantity": "1",
        "workspace_id": '"w1"',
        "occurred_at": '"2026-01-01T00:00:00Z"',
        **fields,
    }
    return "{" + ", ".join(f'"{k}": {v}' for k, v in parts.items() if v is not None) + "}"


def _job(**fields: str) -> str:
    parts = {"data": '{"bad": true}', **fields}
    return "{" + ", ".join(f'"{k}": {v}' for k, v in parts.items()) + "}"


USAGE = "/v1/usage-events"
JOBS = f"/v1/jobs/{HOSTILE}"
TIMERS = f"/v1/timers/{HOSTILE}"


def catalogue() -> list[Case]:
    """Every kind of bad request once."""
    cases: list[Case] = []

    def add(kind: str, raw: bytes, expect: set[int | None], names: str | None = None) -> None:
        cases.append(Case(kind, [raw], expect, names))

    # Malformed.
    for n, body in enumerate(
        [
            b"{nope",
            b"[1, 2]",
            b'"a string"',
            b'{"data": }',
            b'{"data": {}} trailing',
            b"\xef\xbb\xbf" + _job().encode(),
            b'{"data": {"x": "\xff\xfe"}}',
            b'{"data": {"x": "a\x01b"}}',
            b'{"data": NaN}',
            b'{"data": {"x": -Infinity}}',
            b"",
        ]
    ):
        add(f"malformed-{n}", _post(JOBS, body), {400})
    add("not-utf8", _post(USAGE, _event().encode("utf-16")), {400}, "UTF-8")
    add("events-not-a-list", _post(USAGE, '{"events": "x"}'), {400}, "events")
    add("events-empty", _post(USAGE, '{"events": []}'), {400}, "events")
    add("event-not-object", _post(USAGE, '{"events": [1]}'), {400}, "(event)")
    # Oversized.
    add("events-1001", _post(USAGE, '{"events": [' + ",".join([_event()] * 1001) + "]}"), {400})
    add("body-2MiB", _post(JOBS, b'{"data": "' + b"x" * (2 << 20) + b'"}'), {413}, "too large")
    add("meter-201", _post(USAGE, _event(meter='"' + "m" * 201 + '"')), {400}, "meter")
    add("key-501", _post(JOBS, _job(singleton_key='"' + "k" * 501 + '"')), {400}, "singleton_key")
    add("huge-unknown-key", _post(USAGE, _event(**{"k" * 200_000: "1"})), {400}, "kkkk")
    chunked = request_head("POST", JOBS, {**JSON, "Transfer-Encoding": "chunked"})
    big_chunks = b"".join(f"{32768:x}\r\n".encode() + b" " * 32768 + b"\r\n" for _ in range(40))
    add("chunked-over-1MiB", chunked + b'8\r\n{"data":\r\n' + big_chunks + b"0\r\n\r\n", {413})
    # Deeply nested.
    for depth in (65, 100, 965, 969, 5000, 100_000):
        add(f"nested-{depth}", _post(JOBS, _job(data="[" * depth + "]" * depth)), {400}, "nest")
        obj = '{"a": ' * depth + "1" + "}" * depth
        add(f"nested-obj-{depth}", _post(USAGE, _event(dimensions=obj)), {400}, "nest")
    # NUL-bearing and lone surrogates.
    for escape in (r"\u0000", r"\ud800", r"\udfff"):
        tag = escape[2:]
        add(f"meter-{tag}", _post(USAGE, _event(meter=f'"a{escape}"')), {400}, "meter")
        add(f"ws-{tag}", _post(USAGE, _event(workspace_id=f'"{escape}"')), {400}, "workspace_id")
        add(f"dim-{tag}", _post(USAGE, _event(dimensions=f'{{"r": "{escape}"}}')), {400}, "dim")
        add(f"dimkey-{tag}", _post(USAGE, _event(dimensions=f'{{"{escape}": 1}}')), {400}, "dim")
        add(f"data-{tag}", _post(JOBS, _job(data=f'{{"x": ["{escape}"]}}')), {400}, "data.x.0")
        add(f"datakey-{tag}", _post(JOBS, _job(data=f'{{"{escape}": 1}}')), {400}, "data")
        add(f"skey-{tag}", _post(JOBS, _job(singleton_key=f'"{escape}"')), {400}, "singleton_key")
        body = f'{{"delay_seconds": 1, "key": "k{escape}"}}'
        add(f"timerkey-{tag}", _post(TIMERS, body), {400}, "key")
    add("queue-%00", _post(f"/v1/jobs/{HOSTILE}%00", _job()), {400}, "queue")
    add(
        "timer-queue-%00", _post(f"/v1/timers/{HOSTILE}%00", '{"delay_seconds": 1}'), {400}, "queue"
    )
    delete = request_head("DELETE", f"/v1/timers/{HOSTILE}/k%00", AUTH)
    add("delete-key-%00", delete, {400}, "key")
    # Lying: wrong types, out-of-range values, duplicate keys, content types, missing fields.
    for n, fields in enumerate(
        [
            {"quantity": '"3"'},
            {"quantity": "true"},
            {"quantity": "-1"},
            {"quantity": "1e400"},
            {"dimensions": '{"big": 1e400}'},
            {"dimensions": "[1]"},
            {"occurred_at": '"2026-01-01T00:00:00"'},
            {"occurred_at": '"9999-12-31T23:59:59-01:00"'},
            {"occurred_at": '"0001-01-01T00:00:00+01:00"'},
            {"occurred_at": None},
            {"id": '"not-a-ulid"'},
            {"colour": '"red"'},
        ]
    ):
        add(f"event-field-{n}", _post(USAGE, _event(**fields)), {400}, next(iter(fields)))
    for n, fields in enumerate(
        [
            {"start_after_seconds": '"5"'},
            {"start_after_seconds": "true"},
            {"start_after_seconds": "1e13"},
            {"start_after_seconds": "1e308"},
            {"start_after_seconds": "1e400"},
            {"start_after_seconds": "-1"},
            {"priority": '"high"'},
            {"priority": "1.5"},
            {"priority": "1e400"},
            {"data": "1"},
            {"data": '{"x": 1e400}'},
        ]
    ):
        add(f"job-field-{n}", _post(JOBS, _job(**fields)), {400}, next(iter(fields)))
    for n, body in enumerate(
        [
            '{"delay_seconds": 1e13}',
            '{"delay_seconds": "5"}',
            '{"delay_seconds": false}',
            '{"at": "9999-12-31T23:59:59-01:00"}',
            '{"at": "0001-01-01T00:00:00+01:00"}',
            '{"at": "2030-01-01T00:00:00"}',
        ]
    ):
        add(f"timer-field-{n}", _post(TIMERS, body), {400}, "delay_seconds" if n < 3 else "at")
    duplicate = _event(quantity="1")[:-1] + ', "quantity": 1000}'
    add("duplicate-key", _post(USAGE, duplicate), {400}, "quantity")
    add("duplicate-nested", _post(JOBS, '{"data": {"a": 1, "a": 2}}'), {400}, "twice")
    for n, content_type in enumerate(
        [
            None,
            "text/plain",
            "application/x-www-form-urlencoded",
            "application/json; charset=latin-1",
        ]
    ):
        headers = dict(AUTH) if content_type is None else {**AUTH, "Content-Type": content_type}
        add(f"content-type-{n}", _post(USAGE, _event(), headers), {415}, "Content-Type")
        add(f"content-type-job-{n}", _post(JOBS, _job(), headers), {415}, "Content-Type")
    add("no-token", _post(JOBS, _job(), {"Content-Type": "application/json"}), {401}, "token")
    add("wrong-token", _post(JOBS, _job(), {**JSON, "Authorization": "Bearer no"}), {401}, "token")
    text = _job().encode()
    add("length-short", _post(JOBS, text, {**JSON, "Content-Length": str(len(text) - 1)}), {400})
    add("length-abc", _post(JOBS, text, {**JSON, "Content-Length": "abc"}), {400})
    add("length-negative", _post(JOBS, text, {**JSON, "Content-Length": "-1"}), {400})
    both = {**JSON, "Content-Length": str(len(text)), "Transfer-Encoding": "chunked"}
    add("length-and-chunked", _post(JOBS, text, both), {400}, "Transfer-Encoding")
    # A chunk announced past 1 MiB is 413 at its size line (issue 28 item 8), not a wait for
    # the body timeout; so is a body whose chunks add up past it.
    for bits in (21, 60, 80, 400):
        head = request_head("POST", JOBS, {**JSON, "Transfer-Encoding": "chunked"})
        add(f"chunk-2^{bits}", head + f"{2**bits:x}\r\n{{".encode(), {413}, "too large")
    first = b'{"data": "' + b"x" * (600 * 1024)
    two = chunked + f"{len(first):x}\r\n".encode() + first + b"\r\n" + b"96000\r\nxx"
    add("chunks-past-1MiB-announced", two, {413}, "too large")
    # obs-fold (RFC 9112 section 5.2): 400 naming it, not a 415 for the folded Content-Type.
    folded = _post(JOBS, _job()).replace(
        b"Content-Type: application/json", b"Content-Type: application/json\r\n x"
    )
    add("obs-fold-content-type", folded, {400}, "folding")
    tabbed = _post(JOBS, _job()).replace(b"Host: 127.0.0.1", b"Host: 127.0.0.1\r\n\tmore")
    add("obs-fold-tab", tabbed, {400}, "folding")
    add(
        "obs-fold-probe",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n b\r\n\r\n",
        {400},
        "folding",
    )
    # A queue named with an encoded slash (item 11) or Unicode digits (item 7): none installed.
    add("queue-slash-unknown", _post(f"/v1/jobs/{HOSTILE}%2Fnope", _job()), {404}, "installed")
    add("queue-superscript", _post("/v1/jobs/%C2%B2", _job()), {404}, "installed")
    # request_head writes headers as latin-1: these two characters are the UTF-8 bytes of ².
    utf8_superscript = "\u00c2\u00b2"
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {utf8_superscript}"}
    add("token-non-ascii", _post(JOBS, _job(), headers), {401}, "token")
    add("bad-request-line", b"GARBAGE\r\n\r\n", {400})
    add(
        "header-over-limit",
        request_head("POST", JOBS, {**JSON, "X-Big": "x" * (1 << 20)}),
        {400, 431, None},
    )
    # Slow: silent, dribbled head, stalled body, dribbled body; and clients that hang up.
    head = _post(JOBS, _job())
    cases.append(Case("silent", [b"", b""], {None, 408}, pause=HEADER_TIMEOUT + 1))
    dribble = [head[i : i + 1] for i in range(len(head))]
    cases.append(Case("slow-head", dribble, {408}, "headers", pause=0.1))
    lying = request_head("POST", JOBS, {**JSON, "Content-Length": "100"}) + b'{"data": {'
    cases.append(Case("stalled-body", [lying], {408}, "body"))
    body = _job(data='{"pad": "' + "p" * 300 + '"}').encode()
    dribbled = [request_head("POST", JOBS, {**JSON, "Content-Length": str(len(body))})]
    dribbled += [body[i : i + 1] for i in range(len(body))]
    cases.append(Case("slow-body", dribbled, {408}, "body", pause=0.05))
    hang_up = request_head("POST", USAGE, {**JSON, "Content-Length": "5000"}) + b'{"events": ['
    cases.append(Case("hang-up", [hang_up], {None}, hang_up=True))
    return cases


def admin_catalogue(csrf: str) -> list[Case]:
    """Every kind of bad request to the admin API and the console once (issue 28 items 7 and
    11): Unicode digits, numbers past a bigint or 10,000 digits long, NULs, non-ASCII tokens,
    forged CSRF tokens and a bad ``expected`` on an otherwise valid pause of the hostile queue
    (``csrf``: a valid token, from a confirmation page)."""
    cases: list[Case] = []

    def add(kind: str, raw: bytes, expect: set[int | None], names: str | None = None) -> None:
        cases.append(Case(kind, [raw], expect, names))

    huge = "9" * 10_000
    for n, (path, status, names) in enumerate(
        [
            ("/v1/admin/jobs/%C2%B2", 404, "job id"),
            ("/v1/admin/jobs/%D9%A3", 404, "job id"),
            (f"/v1/admin/jobs/{huge}", 404, "job id"),
            (f"/v1/admin/jobs/{2**63}", 404, "job id"),
            ("/v1/admin/jobs?after=%C2%B2", 400, "after"),
            (f"/v1/admin/jobs?after={huge}", 400, "after"),
            ("/v1/admin/jobs?limit=%C2%B2", 400, "limit"),
            ("/v1/admin/jobs?limit=1_0", 400, "limit"),
        ]
    ):
        add(f"admin-get-{n}", request_head("GET", path, ADMIN_AUTH), {status}, names)
    for n, path in enumerate(
        [
            "/console/jobs/%C2%B2",
            f"/console/jobs/{huge}",
            "/console/jobs?after=%C2%B2",
            "/console/confirm?kind=job&action=retry&id=%C2%B2",
            "/console/confirm?kind=held&action=discard&id=%00",
            "/console/confirm?kind=held&action=redrive&id=job:" + "9" * 30,
            "/console/confirm?kind=queue&action=pause&queue=%00",
        ]
    ):
        add(f"console-get-{n}", request_head("GET", path, CONSOLE_AUTH), {400, 404})
    admin_json = {**ADMIN_AUTH, "Content-Type": "application/json"}
    add("admin-queue-nul", _post("/v1/admin/queues/%00/pause", "", admin_json), {400}, "queue")
    slashed = f"/v1/admin/queues/{HOSTILE}%2Fnope/pause"
    add("admin-queue-slash-unknown", _post(slashed, "", admin_json), {404}, "not exist")
    add("admin-ids-huge", _post("/v1/admin/jobs/retry", '{"ids": [1e30]}', admin_json), {400})
    add(
        "admin-ids-bigint",
        _post("/v1/admin/jobs/retry", f'{{"ids": [{2**70}]}}', admin_json),
        {400},
    )
    surrogate = '{"filter": {"queue": "\\ud800"}, "dry_run": false}'
    add(
        "admin-filter-surrogate",
        _post("/v1/admin/jobs/retry", surrogate, admin_json),
        {400},
        "queue",
    )
    add("admin-ids-text", _post("/v1/admin/jobs/retry", '{"ids": ["\u00b2"]}', admin_json), {400})
    # request_head writes headers as latin-1: "\u00c2\u00b2" goes out as the UTF-8 bytes of ².
    utf8_superscript = "\u00c2\u00b2"
    pause = f"/v1/admin/queues/{HOSTILE}/pause"
    add(
        "admin-token-non-ascii",
        _post(pause, "", {"Authorization": f"Bearer {utf8_superscript}"}),
        {401},
    )
    basic = base64.b64encode("ops:\u00b2".encode()).decode()
    add(
        "console-password-non-ascii",
        request_head("GET", "/console/", {"Authorization": f"Basic {basic}"}),
        {401},
    )
    stamp, _, signature = csrf.partition(".")
    form = f"kind=queue&action=pause&queue={HOSTILE}"
    for n, forged in enumerate(
        [
            f"{stamp}.%C2%B2",
            f"{stamp}." + "%C3%A9" * len(signature),
            f"%C2%B2{stamp}.{signature}",
            f"{'9' * 5000}.{signature}",
        ]
    ):
        add(
            f"console-csrf-{n}", _post("/console/act", f"csrf={forged}&{form}", CONSOLE_FORM), {403}
        )
    for n, extra in enumerate(["expected=%C2%B2", "expected=" + "9" * 5000, "expected=-1"]):
        body = f"csrf={csrf}&{form}&{extra}"
        add(f"console-expected-{n}", _post("/console/act", body, CONSOLE_FORM), {400}, "expected")
    for n, body in enumerate(
        [
            "kind=job&action=retry&id=%C2%B2",
            "kind=job&action=retry&id=" + "9" * 5000,
            "kind=queue&action=pause&queue=-x",
            "kind=held&action=discard&id=job:" + "9" * 30,
        ]
    ):
        add(f"console-form-{n}", _post("/console/act", f"csrf={csrf}&{body}", CONSOLE_FORM), {400})
    return cases


def run_case(port: int, case: Case) -> Outcome:
    """Send one hostile request and judge its answer."""
    answer = exchange(
        port, case.parts, pause=case.pause, timeout=HANG_SECONDS, close_after_send=case.hang_up
    )
    outcome = Outcome(case, answer)
    if answer.hung:
        outcome.problems.append("no answer and no close: hung")
    elif answer.status is None and not answer.closed:
        outcome.problems.append("no status")
    if answer.status not in case.expect:
        outcome.problems.append(f"status {answer.status}, expected {sorted(map(str, case.expect))}")
    said = answer.body.decode(errors="replace").lower()
    if answer.status is not None and case.names is not None and case.names.lower() not in said:
        outcome.problems.append(f"answer does not name {case.names!r}: {answer.body[:200]!r}")
    is_json = answer.headers.get("content-type") == "application/json"
    if is_json and (not isinstance(answer.json(), dict) or "error" not in answer.json()):
        outcome.problems.append(f"JSON answer without an error: {answer.body[:200]!r}")
    # A console page is HTML around its message: a few kilobytes of its own.
    limit = 8_000 if answer.headers.get("content-type", "").startswith("text/html") else 4_000
    if len(answer.body) > limit:
        outcome.problems.append(f"an answer of {len(answer.body)} bytes echoes the input")
    return outcome


class GoodTraffic:
    """Posts good events, jobs and timers back to back while the hostile ones run; keeps each
    status and how long it took."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.answers: list[tuple[str, int, float]] = []
        self.event_ids: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GoodTraffic:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        requests: list[tuple[str, Callable[[int], object]]] = [
            ("/v1/usage-events", self._events),
            (f"/v1/jobs/{GOOD}", lambda n: {"data": {"n": n}}),
            (f"/v1/timers/{GOOD}", lambda n: {"delay_seconds": 3600, "data": {"n": n}}),
        ]
        with httpx.Client(timeout=10, headers=AUTH) as client:
            n = 0
            while not self._stop.is_set():
                path, body = requests[n % len(requests)]
                began = time.monotonic()
                try:
                    status = client.post(self.base + path, json=body(n)).status_code
                except httpx.HTTPError:
                    status = 0
                self.answers.append((path, status, time.monotonic() - began))
                n += 1
                self._stop.wait(0.05)

    def _events(self, n: int) -> object:
        events = [
            {
                "id": new_ulid(),
                "meter": "api.calls",
                "quantity": n,
                "workspace_id": "w1",
                "occurred_at": "2026-01-01T00:00:00Z",
                "dimensions": {"region": "eu", "n": n},
            }
            for _ in range(5)
        ]
        self.event_ids.extend(str(e["id"]) for e in events)
        return {"events": events}


async def test_hostile_requests_get_4xx_and_enqueue_nothing_while_good_ones_flow(
    db_url: str, fleet: Fleet, drill_report
):
    """Every kind of bad request, many times over and many at once beside good traffic:
    each answers a 4xx naming its problem (or, for a silent or departed client, a close);
    none answers 5xx or hangs; none enqueues anything; every good request is served."""
    migrated = await asyncio.to_thread(run_cli, db_url, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    pool = await create_pool(db_url, max_size=1)
    try:
        await make_queue(pool, HOSTILE)
        await make_queue(pool, GOOD)
    finally:
        await pool.close()
    env = {
        "INGEST_TOKEN": TOKEN,
        "ADMIN_TOKEN": ADMIN,
        "HTTP_HEADER_TIMEOUT_SECONDS": str(HEADER_TIMEOUT),
        "HTTP_BODY_TIMEOUT_SECONDS": str(BODY_TIMEOUT),
    }
    [api] = await fleet.start_ready(db_url, env, role="api")
    confirm = await asyncio.to_thread(
        httpx.get,
        api.url(f"/console/confirm?kind=queue&action=pause&queue={HOSTILE}"),
        headers=CONSOLE_AUTH,
    )
    found = re.search(r'name="csrf" value="([^"]+)"', confirm.text)
    assert found is not None, confirm.text
    kinds = catalogue() + admin_catalogue(found.group(1))
    rounds = sized(3, 15)
    cases = [case for _ in range(rounds) for case in kinds]
    began = time.monotonic()
    with GoodTraffic(api.url("")) as good, ThreadPoolExecutor(max_workers=sized(24, 64)) as pool_:
        outcomes = await asyncio.to_thread(
            lambda: list(pool_.map(lambda case: run_case(api.port, case), cases))
        )
    elapsed = time.monotonic() - began
    assert api.process.poll() is None, "the api process died"

    failed = [o for o in outcomes if o.problems]
    summary = [f"{o.case.kind}: {'; '.join(o.problems)}" for o in failed[:15]]
    assert not failed, f"{len(failed)} of {len(outcomes)} bad requests misanswered:\n" + "\n".join(
        summary
    )
    statuses = Counter(o.answer.status for o in outcomes)
    assert not [s for s in statuses if s is not None and s >= 500]

    good_statuses = Counter(status for _, status, _ in good.answers)
    assert set(good_statuses) == {202}, f"good requests answered {dict(good_statuses)}"
    slowest_good = max(seconds for *_, seconds in good.answers)

    hostile_rows = await fetchval(db_url, "SELECT count(*) FROM jobs.job WHERE queue = $1", HOSTILE)
    assert hostile_rows == 0, f"{hostile_rows} jobs enqueued by refused requests"
    usage_rows = await fetchval(
        db_url, "SELECT count(*) FROM jobs.job WHERE queue = 'usage-events'"
    )
    assert usage_rows == len(good.event_ids), (
        f"{usage_rows} usage rows for {len(good.event_ids)} good events: a refused one got in"
    )
    good_rows = await fetchval(db_url, "SELECT count(*) FROM jobs.job WHERE queue = $1", GOOD)
    assert good_rows == good_statuses[202] - len(good.event_ids) // 5
    # The refused admin and console requests acted on nothing: no pause, no audit row.
    paused = await fetchval(db_url, "SELECT paused FROM jobs.queue WHERE name = $1", HOSTILE)
    assert paused is False, "a refused console form paused the hostile queue"
    audited = await fetchval(db_url, "SELECT count(*) FROM public.audit_log")
    assert audited == 0, f"{audited} audit rows written by refused requests"

    logs = api.logs()
    assert "Traceback" not in logs, logs[logs.index("Traceback") - 500 :][:3000]
    hang_ups = sum(1 for o in outcomes if o.case.hang_up)
    # A body h11 refuses mid-read (a bad chunk) also ends the app's read with a disconnect.
    broken = sum(1 for o in outcomes if o.case.kind.startswith(("chunk-", "length-and")))
    disconnects = len(log_events(api, "http.client_disconnected"))
    assert hang_ups <= disconnects <= hang_ups + broken
    # What the listener refused itself (announced chunks past 1 MiB, obs-fold): one line each.
    screened = sum(1 for o in outcomes if o.case.kind.startswith(("chunk", "obs-fold")))
    assert len(log_events(api, "http.refused")) == screened
    assert api.get("/readyz")[0] == 200

    slowest_bad = max(o.answer.seconds for o in outcomes)
    shown = ", ".join(f"{n} x {s or 'close'}" for s, n in sorted(statuses.items(), key=str))
    drill_report(
        f"drill 23 hostile input [{SCALE}: {len(kinds)} kinds x {rounds} = {len(outcomes)} bad"
        f" requests, {sized(24, 64)} at a time, beside {len(good.answers)} good ones; header"
        f" {HEADER_TIMEOUT:g}s, body {BODY_TIMEOUT:g}s]: every bad one refused as expected"
        f" ({shown}), 0 x 5xx, 0 hung (slowest {slowest_bad:.1f}s, the slow clients);"
        f" good: {good_statuses[202]} x 202, slowest {slowest_good:.2f}s; nothing enqueued by a"
        f" refused request (0 rows in {HOSTILE}, {usage_rows} usage rows = good events);"
        f" {hang_ups} hang-ups and {disconnects - hang_ups} bodies cut by the parser: one"
        f" log line each, no traceback; {elapsed:.0f}s"
    )
