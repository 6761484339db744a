"""The admin HTTP API (/v1/admin) and the console's gate, on a real api process."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator

import asyncpg
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.postgres import installed_database
from tests.support.processes import Daemon, ready_daemon
from tests.support.queues import make_queue
from tests.usage.conftest import fetch

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("admin-http")]

ADMIN = "admin-token-for-tests"
VIEWER = "viewer-token-for-tests"
INGEST = "ingest-token-for-tests"


@pytest.fixture(scope="module")
def shared_db(admin_url: str, template_name: str) -> Iterator[str]:
    """An installed database with a queue ``reports``."""

    async def queues(pool: asyncpg.Pool) -> None:
        await make_queue(pool, "reports", retry_limit=0)

    with installed_database(admin_url, template_name, queues) as url:
        yield url


def _api(shared_db: str, tmp: pytest.TempPathFactory, name: str, **env: str) -> Iterator[Daemon]:
    with ready_daemon(shared_db, tmp.mktemp(name), role="api", env=env, name=name) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def api(shared_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """An api process with all three tokens set and job data hidden (the default)."""
    yield from _api(
        shared_db,
        tmp_path_factory,
        "api",
        ADMIN_TOKEN=ADMIN,
        CONSOLE_VIEW_TOKEN=VIEWER,
        INGEST_TOKEN=INGEST,
    )


@pytest.fixture(scope="module")
def closed(shared_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """An api process with neither admin token set."""
    yield from _api(shared_db, tmp_path_factory, "closed", INGEST_TOKEN=INGEST)


def bearer(token: str) -> dict[str, str]:
    """An Authorization header with a bearer token."""
    return {"Authorization": f"Bearer {token}"}


def basic(token: str) -> dict[str, str]:
    """An Authorization header with HTTP Basic credentials whose password is ``token``."""
    return {"Authorization": "Basic " + base64.b64encode(f"ops:{token}".encode()).decode()}


def failed_job(url: str, data: dict[str, object] | None = None) -> int:
    """A job of queue reports in state failed with error text, returned by id."""
    job_id: int = fetch(
        url,
        "INSERT INTO jobs.job (queue, data, state, retry_limit, retry_count, retry_delay,"
        " retry_backoff, expire_seconds, completed_at, output) VALUES ('reports', $1::text::jsonb,"
        " 'failed', 0, 1, 0, false, 60, now(), '{\"error\": \"boom\"}') RETURNING id",
        json.dumps(data or {"secret": "personal data"}),
    )[0]["id"]
    return job_id


def paused_gauge(daemon: Daemon, expected: float) -> float | None:
    """``queue_paused{queue="reports"}``, polled until it reads ``expected`` (the gauges are
    recounted at most every 5 s per process) or 15 s passed."""
    deadline = time.monotonic() + 15
    value = None
    while time.monotonic() < deadline:
        text = httpx.get(daemon.url("/metrics")).text
        value = next(
            (
                sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.name == "queue_paused" and sample.labels == {"queue": "reports"}
            ),
            None,
        )
        if value == expected:
            break
        time.sleep(0.5)
    return value


def state_of(url: str, job_id: int) -> str:
    """The job's state now."""
    return str(fetch(url, "SELECT state::text AS s FROM jobs.job WHERE id = $1", job_id)[0]["s"])


def audit_count(url: str) -> int:
    """How many audit rows exist."""
    return int(fetch(url, "SELECT count(*) AS n FROM public.audit_log")[0]["n"])


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), (bearer(INGEST), 401), (bearer("wrong"), 401), (bearer(VIEWER), 403)],
)
def test_a_post_without_the_admin_token_changes_nothing(
    api: Daemon, shared_db: str, headers: dict[str, str], status: int
) -> None:
    """No token, the ingest token or an unknown one is 401; the view token on a POST is 403;
    the job stays failed and no audit row is written."""
    job_id = failed_job(shared_db)
    before = audit_count(shared_db)
    response = httpx.post(api.url("/v1/admin/jobs/retry"), json={"ids": [job_id]}, headers=headers)
    assert response.status_code == status, response.text
    assert state_of(shared_db, job_id) == "failed"
    assert audit_count(shared_db) == before


def test_with_neither_token_every_admin_surface_is_disabled(closed: Daemon) -> None:
    """Without ADMIN_TOKEN and CONSOLE_VIEW_TOKEN, /v1/admin and /console answer 403 whatever
    is sent, the ingest token included."""
    for path in ("/v1/admin/queues", "/v1/admin/jobs", "/v1/admin/nothing-here"):
        for headers in ({}, bearer(INGEST), bearer(ADMIN)):
            response = httpx.get(closed.url(path), headers=headers)
            assert response.status_code == 403, (path, headers)
            assert response.json() == {"error": "admin disabled"}
    assert httpx.post(closed.url("/v1/admin/jobs/retry"), json={"ids": [1]}).status_code == 403
    for path in ("/console/", "/console/jobs"):
        assert httpx.get(closed.url(path), headers=basic(ADMIN)).status_code == 403


def test_the_view_token_reads_with_data_redacted(api: Daemon, shared_db: str) -> None:
    """A viewer lists and reads jobs; data shows only its size (ADMIN_SHOW_DATA is off), the
    error text is shown."""
    job_id = failed_job(shared_db, {"secret": "personal data"})
    one = httpx.get(api.url(f"/v1/admin/jobs/{job_id}"), headers=bearer(VIEWER))
    assert one.status_code == 200
    body = one.json()
    stored = fetch(
        shared_db, "SELECT octet_length(data::text) AS n FROM jobs.job WHERE id = $1", job_id
    )
    assert body["data"] == {"redacted": True, "bytes": stored[0]["n"]}
    assert body["error"] == "boom"
    listed = httpx.get(
        api.url("/v1/admin/jobs"),
        params={"queue": "reports", "state": "failed"},
        headers=bearer(VIEWER),
    ).json()
    assert job_id in [j["id"] for j in listed["jobs"]]
    assert all(j["data"].get("redacted") for j in listed["jobs"])
    assert httpx.get(api.url("/v1/admin/jobs/99999999"), headers=bearer(VIEWER)).status_code == 404
    queues = httpx.get(api.url("/v1/admin/queues"), headers=bearer(VIEWER)).json()["queues"]
    assert {"name", "counts", "oldest_waiting_seconds", "paused"} <= set(queues[0])


def test_admin_retries_by_ids_and_by_filter_with_a_dry_run_first(
    api: Daemon, shared_db: str
) -> None:
    """Retry by ids answers what changed and writes an api/admin audit row; a filter without
    dry_run only counts; with dry_run false it changes them."""
    first = failed_job(shared_db)
    response = httpx.post(
        api.url("/v1/admin/jobs/retry"), json={"ids": [first, 2**40]}, headers=bearer(ADMIN)
    )
    # skipped: jobs left alone to keep a key's promise (none here).
    assert response.json() == {"changed": 1, "ids": [first], "skipped": 0}
    [row] = fetch(
        shared_db,
        "SELECT actor_via, principal, action FROM public.audit_log ORDER BY id DESC LIMIT 1",
    )
    assert tuple(row.values()) == ("api", "admin", "job.retry")
    more = [failed_job(shared_db) for _ in range(3)]
    filt = {"queue": "reports", "state": "failed"}
    before = audit_count(shared_db)
    dry = httpx.post(api.url("/v1/admin/jobs/retry"), json={"filter": filt}, headers=bearer(ADMIN))
    assert dry.json()["dry_run"] is True
    assert dry.json()["changed"] >= 3
    assert [state_of(shared_db, i) for i in more] == ["failed"] * 3
    assert audit_count(shared_db) == before
    live = httpx.post(
        api.url("/v1/admin/jobs/retry"),
        json={"filter": filt, "dry_run": False},
        headers=bearer(ADMIN),
    )
    assert live.json()["changed"] == dry.json()["changed"]
    assert [state_of(shared_db, i) for i in more] == ["retry"] * 3
    assert audit_count(shared_db) == before + 1


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({}, 400),
        ({"ids": [1], "filter": {"queue": "reports"}}, 400),
        ({"ids": "1"}, 400),
        ({"ids": [True]}, 400),
        ({"filter": {"state": "failed"}}, 400),
        ({"filter": {"queue": "reports", "state": "done"}}, 400),
        ({"filter": {"queue": "reports", "since": "yesterday"}}, 400),
        ({"filter": {"queue": "reports"}, "dry_run": "no"}, 400),
        ({"ids": [1], "dry_run": False}, 400),
        ({"ids": [1], "extra": 1}, 400),
    ],
)
def test_bad_action_bodies_are_400_naming_the_problem(
    api: Daemon, body: dict[str, object], status: int
) -> None:
    """Malformed action requests answer 4xx with an error text, never a 500."""
    response = httpx.post(api.url("/v1/admin/jobs/cancel"), json=body, headers=bearer(ADMIN))
    assert response.status_code == status, response.text
    assert response.json()["error"]


def test_queue_actions_over_http(api: Daemon, shared_db: str) -> None:
    """pause and resume flip the flag shown in /v1/admin/queues and the queue_paused gauge;
    an unknown queue is 404."""
    paused = httpx.post(api.url("/v1/admin/queues/reports/pause"), headers=bearer(ADMIN))
    assert paused.json() == {"queue": "reports", "paused": True, "changed": True}
    queues = httpx.get(api.url("/v1/admin/queues"), headers=bearer(ADMIN)).json()["queues"]
    assert next(q for q in queues if q["name"] == "reports")["paused"] is True
    assert paused_gauge(api, 1.0) == 1.0
    httpx.post(api.url("/v1/admin/queues/reports/resume"), headers=bearer(ADMIN))
    assert paused_gauge(api, 0.0) == 0.0
    assert (
        httpx.post(api.url("/v1/admin/queues/nope/pause"), headers=bearer(ADMIN)).status_code == 404
    )
