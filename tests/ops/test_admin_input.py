"""Untrusted input on the admin API and the console (issue 28 items 7, 11 and 15), on real api
processes: Unicode digits, oversized numbers, non-ASCII tokens, NULs, queue names with a slash,
and what the held-usage page shows with ADMIN_SHOW_DATA off and on."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Callable, Iterator
from urllib.parse import quote

import asyncpg
import httpx
import pytest

from api_sender import USAGE_HELD_QUEUE, Sender, UsageEvent
from tests.support.postgres import installed_database
from tests.support.processes import Daemon, ready_daemon
from tests.support.queues import make_queue
from tests.support.rawhttp import exchange, request_head
from tests.usage.conftest import fetch

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("admin-input")]

ADMIN = "admin-token-for-input-tests"
VIEWER = "viewer-token-for-input-tests"
INGEST = "ingest-token-for-input-tests"
#: A queue name the name check allows that holds a slash.
SLASHED = "team/reports"
#: What the held event's body says: none of it may show while ADMIN_SHOW_DATA is off.
HELD_METER = "meter-held-secret"
HELD_WORKSPACE = "workspace-held-secret"
HELD_DIMENSION = "dimension-held-secret"
#: A Unicode superscript two: str.isdigit() says yes, int() refuses it.
SUPERSCRIPT_TWO = "%C2%B2"
#: An Arabic-Indic three: str.isdigit() says yes and int() reads it as 3.
ARABIC_THREE = "%D9%A3"
HUGE = "9" * 10_000
PAST_BIGINT = str(2**63)


@pytest.fixture(scope="module")
def shared_db(admin_url: str, template_name: str) -> Iterator[str]:
    """An installed database with queues ``reports`` and ``team/reports`` and one held usage
    event whose meter, workspace and dimensions are recognisable."""

    async def prepare(pool: asyncpg.Pool) -> None:
        await make_queue(pool, "reports", retry_limit=0)
        await make_queue(pool, SLASHED, retry_limit=0)
        event = UsageEvent(HELD_METER, 17.5, HELD_WORKSPACE, dimensions={"region": HELD_DIMENSION})
        await Sender(pool).send(USAGE_HELD_QUEUE, event.to_job_data())

    with installed_database(admin_url, template_name, prepare) as url:
        yield url


def _api(shared_db: str, tmp: pytest.TempPathFactory, name: str, **env: str) -> Iterator[Daemon]:
    tokens = {"ADMIN_TOKEN": ADMIN, "CONSOLE_VIEW_TOKEN": VIEWER, "INGEST_TOKEN": INGEST}
    with ready_daemon(
        shared_db, tmp.mktemp(name), role="api", env={**tokens, **env}, name=name
    ) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def api(shared_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """An api process with all three tokens and job data hidden (the default)."""
    yield from _api(shared_db, tmp_path_factory, "api")


@pytest.fixture(scope="module")
def shows_data(shared_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """An api process with ADMIN_SHOW_DATA=true."""
    yield from _api(shared_db, tmp_path_factory, "shows-data", ADMIN_SHOW_DATA="true")


def bearer(token: str) -> dict[str, str]:
    """An Authorization header with a bearer token."""
    return {"Authorization": f"Bearer {token}"}


def basic(token: str) -> dict[str, str]:
    """An Authorization header with HTTP Basic credentials whose password is ``token``."""
    return {"Authorization": "Basic " + base64.b64encode(f"ops:{token}".encode()).decode()}


def audit_count(url: str) -> int:
    """How many audit rows exist."""
    return int(fetch(url, "SELECT count(*) AS n FROM public.audit_log")[0]["n"])


def paused(url: str, queue: str) -> bool:
    """Whether ``queue`` is paused now."""
    return bool(fetch(url, "SELECT paused FROM jobs.queue WHERE name = $1", queue)[0]["paused"])


def csrf_token(daemon: Daemon, query: str) -> str:
    """The CSRF token of the console's confirmation page for ``query``."""
    page = httpx.get(daemon.url(f"/console/confirm?{query}"), headers=basic(ADMIN))
    assert page.status_code == 200, page.text
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None, page.text
    return html.unescape(found.group(1))


def act(daemon: Daemon, form: dict[str, str]) -> httpx.Response:
    """POST ``form`` to /console/act as the admin, from the console's own origin."""
    headers = {**basic(ADMIN), "Origin": f"http://127.0.0.1:{daemon.port}"}
    return httpx.post(daemon.url("/console/act"), data=form, headers=headers)


# --- Item 7: digits that are not ASCII, numbers too large, tokens that are not ASCII -----------


@pytest.mark.parametrize(
    ("path", "status", "names"),
    [
        (f"/v1/admin/jobs/{SUPERSCRIPT_TWO}", 404, "job id"),
        (f"/v1/admin/jobs/{ARABIC_THREE}", 404, "job id"),
        (f"/v1/admin/jobs/{HUGE}", 404, "job id"),
        (f"/v1/admin/jobs/{PAST_BIGINT}", 404, "job id"),
        (f"/v1/admin/jobs?after={SUPERSCRIPT_TWO}", 400, "after"),
        (f"/v1/admin/jobs?after={ARABIC_THREE}", 400, "after"),
        (f"/v1/admin/jobs?after={HUGE}", 400, "after"),
        (f"/v1/admin/jobs?after={PAST_BIGINT}", 400, "after"),
        (f"/v1/admin/jobs?limit={SUPERSCRIPT_TWO}", 400, "limit"),
        (f"/v1/admin/jobs?limit={HUGE}", 400, "limit"),
        ("/v1/admin/jobs?limit=1_0", 400, "limit"),
        ("/v1/admin/jobs?limit=%201", 400, "limit"),
    ],
)
def test_admin_api_numbers_that_are_not_ascii_digits_or_too_large_are_4xx(
    api: Daemon, path: str, status: int, names: str
) -> None:
    """A job id, cursor or limit in Unicode digits, past a bigint or 10,000 digits long is a
    4xx whose error names the value, never a 500 (nor read as some other number)."""
    response = httpx.get(api.url(path), headers=bearer(ADMIN))
    assert response.status_code == status, response.text
    assert names in response.json()["error"], response.text


@pytest.mark.parametrize(
    "path",
    [
        f"/console/jobs/{SUPERSCRIPT_TWO}",
        f"/console/jobs/{ARABIC_THREE}",
        f"/console/jobs/{HUGE}",
        f"/console/jobs?after={SUPERSCRIPT_TWO}",
        f"/console/jobs?after={HUGE}",
        f"/console/confirm?kind=job&action=retry&id={SUPERSCRIPT_TWO}",
        f"/console/confirm?kind=job&action=retry&id={HUGE}",
        f"/console/confirm?kind=held&action=redrive&id=job:{SUPERSCRIPT_TWO}",
        f"/console/confirm?kind=held&action=redrive&id=job:{'9' * 30}",
        "/console/confirm?kind=held&action=discard&id=%00",
        "/console/confirm?kind=queue&action=pause&queue=%00",
        "/console/confirm?kind=queue&action=pause&queue=" + "q" * 101,
    ],
)
def test_console_pages_refuse_values_that_are_not_ids_with_a_4xx(api: Daemon, path: str) -> None:
    """A console page asked for a Unicode-digit, oversized or NUL-bearing id or queue answers a
    4xx page, never a 500."""
    response = httpx.get(api.url(path), headers=basic(ADMIN))
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])


@pytest.mark.parametrize(
    "path",
    [
        "/v1/admin/queues/%00/pause",
        "/v1/admin/queues/re%00ports/resume",
        "/v1/admin/queues/-x/purge",
    ],
)
def test_admin_queue_actions_refuse_a_name_that_cannot_be_a_queue(
    api: Daemon, shared_db: str, path: str
) -> None:
    """A queue name that breaks the name rule (a NUL, a leading dash) is a 400 naming the queue,
    never a database error, and writes no audit row."""
    before = audit_count(shared_db)
    response = httpx.post(api.url(path), headers=bearer(ADMIN))
    assert response.status_code == 400, response.text
    assert "queue" in response.json()["error"]
    assert audit_count(shared_db) == before


@pytest.mark.parametrize(
    "body",
    [
        '{"filter": {"queue": "\\ud800"}}',
        '{"filter": {"queue": "\\ud800"}, "dry_run": false}',
        '{"filter": {"queue": "re\\u0000ports"}, "dry_run": false}',
        '{"filter": {"queue": "-x"}}',
    ],
)
def test_admin_filters_naming_no_possible_queue_are_400(
    api: Daemon, shared_db: str, body: str
) -> None:
    """A bulk action whose filter names a queue no queue can be called (a lone surrogate or a
    NUL from a JSON escape) is a 400 naming the filter's queue, never a database error."""
    before = audit_count(shared_db)
    headers = {**bearer(ADMIN), "Content-Type": "application/json"}
    response = httpx.post(api.url("/v1/admin/jobs/retry"), content=body, headers=headers)
    assert response.status_code == 400, response.text
    assert "filter queue" in response.json()["error"]
    assert audit_count(shared_db) == before


@pytest.mark.parametrize(
    "forge",
    [
        lambda stamp, sig: f"{stamp}.\u00b2",
        lambda stamp, sig: stamp + "." + "\u00e9" * len(sig),
        lambda stamp, sig: f"\u00b2{stamp}.{sig}",
        lambda stamp, sig: f"{stamp}\u0663.{sig}",
        lambda stamp, sig: f"{'9' * 5000}.{sig}",
        lambda stamp, sig: f"{stamp}.{sig}\x00",
    ],
    ids=[
        "sig-superscript",
        "sig-accents",
        "stamp-superscript",
        "stamp-arabic",
        "stamp-huge",
        "nul",
    ],
)
def test_a_csrf_token_that_is_not_ascii_or_not_a_stamp_is_403_and_changes_nothing(
    api: Daemon, shared_db: str, forge: Callable[[str, str], str]
) -> None:
    """A console form whose CSRF token holds non-ASCII text, Unicode digits or a 5,000-digit
    stamp is refused with 403 (or 400 for a NUL); the queue is not paused and no audit row is
    written."""
    stamp, _, signature = csrf_token(api, "kind=queue&action=pause&queue=reports").partition(".")
    before = audit_count(shared_db)
    form = {"kind": "queue", "action": "pause", "queue": "reports"}
    response = act(api, {"csrf": forge(stamp, signature), **form})
    assert response.status_code in (400, 403), response.text[:300]
    assert not paused(shared_db, "reports")
    assert audit_count(shared_db) == before


@pytest.mark.parametrize("expected", ["\u00b2", "\u0663", "9" * 10_000, "-1", "x"])
def test_a_bad_expected_count_is_400_before_the_pause_commits(
    api: Daemon, shared_db: str, expected: str
) -> None:
    """A valid console form whose ``expected`` is not an ASCII count is refused with 400 before
    anything is written: the queue stays unpaused and no audit row appears."""
    token = csrf_token(api, "kind=queue&action=pause&queue=reports")
    before = audit_count(shared_db)
    form = {"csrf": token, "kind": "queue", "action": "pause", "queue": "reports"}
    response = act(api, {**form, "expected": expected})
    assert response.status_code == 400, response.text[:300]
    assert "expected" in response.text
    assert not paused(shared_db, "reports")
    assert audit_count(shared_db) == before


@pytest.mark.parametrize(
    "form",
    [
        {"kind": "job", "action": "retry", "id": "\u00b2"},
        {"kind": "job", "action": "retry", "id": "9" * 10_000},
        {"kind": "queue", "action": "pause", "queue": "-x"},
        {"kind": "held", "action": "discard", "id": "job:" + "9" * 30},
        {"kind": "held", "action": "redrive", "id": "job:\u00b2"},
    ],
)
def test_console_forms_with_bad_ids_are_400_and_write_nothing(
    api: Daemon, shared_db: str, form: dict[str, str]
) -> None:
    """A console form naming a job, queue or held event by a value that cannot be one is a 400,
    with no audit row written."""
    token = csrf_token(api, "kind=queue&action=pause&queue=reports")
    before = audit_count(shared_db)
    response = act(api, {"csrf": token, **form})
    assert response.status_code == 400, response.text[:300]
    assert audit_count(shared_db) == before


@pytest.mark.parametrize(
    ("path", "header"),
    [
        ("/v1/admin/queues", b"Bearer \xc2\xb2"),
        ("/v1/admin/queues", b"Bearer " + ADMIN.encode() + b"\xc3\xa9"),
        ("/v1/admin/queues", b"Bearer \xff\xfe"),
        ("/console/", b"Basic " + base64.b64encode("ops:\u00b2".encode())),
        ("/console/", b"Basic " + base64.b64encode(b"ops:\xff")),
        ("/console/", b"Basic \xc2\xb2"),
        ("/v1/jobs/reports", b"Bearer \xc2\xb2"),
    ],
)
def test_non_ascii_credentials_are_401_never_500(api: Daemon, path: str, header: bytes) -> None:
    """A bearer token or Basic password that is not ASCII (or not UTF-8) is just a wrong
    credential: 401."""
    method = "POST" if path.startswith("/v1/jobs") else "GET"
    raw = request_head(method, path, {"Content-Length": "0"})[:-2] + b"Authorization: " + header
    answer = exchange(api.port, [raw + b"\r\n\r\n"], timeout=10)
    assert answer.status == 401, answer.body[:300]


# --- Item 11: queue names with a slash ----------------------------------------------------------


def test_a_queue_whose_name_holds_a_slash_is_paused_resumed_and_purged_over_http(
    api: Daemon, shared_db: str
) -> None:
    """POST /v1/admin/queues/team%2Freports/{pause,resume,purge} acts on queue team/reports
    (the action is the last path segment), as does the same path with the slash unencoded."""
    encoded = quote(SLASHED, safe="")
    response = httpx.post(api.url(f"/v1/admin/queues/{encoded}/pause"), headers=bearer(ADMIN))
    assert response.status_code == 200, response.text
    assert response.json() == {"queue": SLASHED, "paused": True, "changed": True}
    assert paused(shared_db, SLASHED)
    response = httpx.post(api.url(f"/v1/admin/queues/{SLASHED}/resume"), headers=bearer(ADMIN))
    assert response.json() == {"queue": SLASHED, "paused": False, "changed": True}
    assert not paused(shared_db, SLASHED)
    purge = httpx.post(api.url(f"/v1/admin/queues/{encoded}/purge"), headers=bearer(ADMIN))
    # The api role of a real deployment has no DELETE; this test database's role has.
    assert purge.status_code in (200, 403), purge.text
    unknown = httpx.post(api.url(f"/v1/admin/queues/{encoded}/explode"), headers=bearer(ADMIN))
    assert unknown.status_code == 404
    listed = httpx.get(api.url("/v1/admin/jobs"), params={"queue": SLASHED}, headers=bearer(ADMIN))
    assert listed.status_code == 200


def test_the_console_pauses_and_resumes_a_queue_whose_name_holds_a_slash(
    api: Daemon, shared_db: str
) -> None:
    """The console's confirmation and action forms carry team/reports whole: it is paused, then
    resumed, with the name shown escaped on the overview."""
    query = f"kind=queue&action=pause&queue={quote(SLASHED, safe='')}"
    token = csrf_token(api, query)
    done = act(api, {"csrf": token, "kind": "queue", "action": "pause", "queue": SLASHED})
    assert done.status_code == 200, done.text[:300]
    assert paused(shared_db, SLASHED)
    overview = httpx.get(api.url("/console/"), headers=basic(ADMIN)).text
    assert f"queue={quote(SLASHED, safe='')}" in overview or f"queue={SLASHED}" in overview
    form = {"csrf": token, "kind": "queue", "action": "resume", "queue": SLASHED, "expected": "1"}
    assert act(api, form).status_code == 200
    assert not paused(shared_db, SLASHED)


# --- Item 15: the held-usage page and ADMIN_SHOW_DATA -------------------------------------------


def test_the_held_page_hides_each_events_body_unless_admin_show_data(
    api: Daemon, shows_data: Daemon, shared_db: str
) -> None:
    """With ADMIN_SHOW_DATA off the held page shows each event's id, reason and due time and
    only the size of its body (no meter, workspace, quantity or dimensions); with it on, the
    body's values are shown."""
    [row] = fetch(
        shared_db,
        "SELECT data->>'id' AS id, octet_length(data::text) AS n FROM jobs.job WHERE queue = $1",
        USAGE_HELD_QUEUE,
    )
    hidden = httpx.get(api.url("/console/held"), headers=basic(VIEWER))
    assert hidden.status_code == 200
    for secret in (HELD_METER, HELD_WORKSPACE, HELD_DIMENSION, "17.5"):
        assert secret not in hidden.text, secret
    assert row["id"] in hidden.text
    assert "retry_budget" in hidden.text
    assert f"redacted, {row['n']} bytes" in hidden.text
    shown = httpx.get(shows_data.url("/console/held"), headers=basic(VIEWER))
    assert shown.status_code == 200
    for value in (HELD_METER, HELD_WORKSPACE, HELD_DIMENSION, "17.5", row["id"]):
        assert value in shown.text, value
    assert "redacted" not in shown.text
