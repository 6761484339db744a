"""Resume of jobs that share a key through the CLI and the HTTP admin API (issue 28 item 9):
the newest job of the key comes back, the rest are reported as skipped, nothing fails."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import asyncpg
import httpx
import pytest

from api_sender import Sender
from api_sender.jobs import ActionResult, KeyContention
from tests.support.postgres import installed_database
from tests.support.processes import Daemon, run_cli, start_daemon
from tests.support.queues import make_queue
from worker.http.admin.api import _answer
from worker.settings import Settings
from worker.state import ServiceState

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("admin-http")]

ADMIN = "admin-token-for-key-tests"


async def cancelled_timers(url: str, queue: str, key: str, n: int) -> list[int]:
    """``n`` cancelled timers of one key on ``queue`` (a fresh queue), oldest first."""
    pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
    try:
        await make_queue(pool, queue)
        sender = Sender(pool)
        ids = [await sender.timers.schedule(queue, delay_seconds=3600, key=key) for _ in range(n)]
        assert await sender.timers.cancel(queue, key)
        return ids
    finally:
        await pool.close()


async def states(url: str, ids: list[int]) -> list[str]:
    """The state of each job, in the order given."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT id, state::text AS s FROM jobs.job WHERE id = ANY($1)", ids)
    finally:
        await conn.close()
    found = {row["id"]: row["s"] for row in rows}
    return [found[i] for i in ids]


@pytest.fixture(scope="module")
def shared_db(admin_url: str, template_name: str) -> Iterator[str]:
    """An installed database (the api role waits for the install)."""
    with installed_database(admin_url, template_name) as url:
        yield url


@pytest.fixture(scope="module")
def api(shared_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """An api process with the admin token set."""
    daemon = start_daemon(
        shared_db, tmp_path_factory.mktemp("keys"), role="api", env={"ADMIN_TOKEN": ADMIN}
    )
    try:
        daemon.wait_ready(60)
        yield daemon
    finally:
        daemon.stop()


def test_cli_resume_of_one_keys_timers_reports_the_skipped(shared_db: str) -> None:
    """jobs resume ID... on three cancelled timers of one key resumes the newest and says
    two were skipped; the filter form counts the same way first, then changes nothing more."""
    ids = asyncio.run(cancelled_timers(shared_db, "cli-t", "k", 3))
    dry = run_cli(shared_db, "jobs", "resume", "--queue", "cli-t")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("would resume 1 job(s) (2 skipped: "), dry.stdout
    by_ids = run_cli(shared_db, "jobs", "resume", *map(str, ids))
    assert by_ids.returncode == 0, by_ids.stderr
    lines = by_ids.stdout.splitlines()
    assert lines[0].startswith("resumed 1 of 3 job(s) (2 skipped: "), lines
    assert lines[1:] == [str(ids[-1])]
    again = run_cli(shared_db, "jobs", "resume", "--queue", "cli-t", "--yes")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("resumed 0 job(s) (2 skipped: "), again.stdout
    assert asyncio.run(states(shared_db, ids)) == ["cancelled", "cancelled", "created"]


def test_admin_api_resume_of_one_keys_timers_answers_the_skipped(
    api: Daemon, shared_db: str
) -> None:
    """POST /v1/admin/jobs/resume on timers of one key answers 200 with the newest changed
    and a skipped count, by ids and by filter (dry run and live), never a database error."""
    ids = asyncio.run(cancelled_timers(shared_db, "http-t", "k", 3))
    auth = {"Authorization": f"Bearer {ADMIN}"}
    url = api.url("/v1/admin/jobs/resume")
    dry = httpx.post(url, json={"filter": {"queue": "http-t"}}, headers=auth)
    assert dry.status_code == 200, dry.text
    assert dry.json() == {"changed": 1, "ids": [], "skipped": 2, "dry_run": True}
    by_ids = httpx.post(url, json={"ids": ids}, headers=auth)
    assert by_ids.status_code == 200, by_ids.text
    assert by_ids.json() == {"changed": 1, "ids": [ids[-1]], "skipped": 2}
    live = httpx.post(url, json={"filter": {"queue": "http-t"}, "dry_run": False}, headers=auth)
    assert live.status_code == 200, live.text
    assert live.json() == {"changed": 0, "ids": [], "skipped": 2, "dry_run": False}


async def test_admin_api_answers_key_contention_with_409_not_500(
    pool: asyncpg.Pool, db_url: str
) -> None:
    """A resume that met a send of its key three times in a row (KeyContention: nothing changed)
    is 409 naming it on the admin API, not a bare 500."""
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None, database_url=db_url, service_role="api"
    )
    state = ServiceState(settings=settings, pool=pool, sender=Sender(pool), not_ready_reason=None)

    async def contended(_sender: Sender) -> ActionResult:
        raise KeyContention("resume")

    response = await _answer(state, contended, lambda result: result, action="resume")
    assert response.status_code == 409
    assert "resume" in json.loads(bytes(response.body))["error"]
