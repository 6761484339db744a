"""The console in a real browser: headless Chromium (Debian's package) driven by Playwright.

Screenshots of every step land in ``artifacts/console/`` (kept by CI as test artifacts).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.support.postgres import installed_database
from tests.support.processes import ROOT, Daemon, ready_daemon
from tests.support.queues import make_queue
from tests.support.tools import find_tool, unavailable
from tests.usage.conftest import fetch as _fetch

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("console-browser")]

ADMIN = "console-admin-token"
VIEWER = "console-viewer-token"
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "artifacts" / "console"
#: The flags a root, offline, headless Chromium needs here (no sandbox as root; no calls home).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
XSS_DATA = {"note": "<script>alert('data')</script>", "img": "<img src=x onerror=alert('d2')>"}
XSS_ERROR = "Error: <img src=x onerror=alert('error')><script>alert('e2')</script>"


def fetch(url: str, query: str, *args: Any) -> list[Any]:
    """One query, run on a thread of its own: Playwright's sync API keeps an event loop
    running on the test's thread, where asyncio.run refuses to start another."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(_fetch, url, query, *args).result()


def _browser_or_skip() -> Any:
    """Playwright's sync API and Debian's Chromium; under CI=true a missing one fails."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("the console browser tests need playwright (pip install -e '.[test]')")
    if not (Path(CHROMIUM).exists() or find_tool("chromium")):
        unavailable("the console browser tests need chromium (apt-get install chromium)")
    return sync_playwright


@pytest.fixture(scope="module")
def shared_db(admin_url: str, template_name: str) -> Iterator[str]:
    """An installed database with queue ``reports`` holding failed jobs and a hostile job."""

    async def prepare(pool: asyncpg.Pool) -> None:
        await make_queue(pool, "reports", retry_limit=0)
        await make_queue(pool, "emails")
        await make_queue(pool, "billing-sync")
        await make_queue(pool, "reindex")
        # A lived-in hour for the overview (and the README's screenshot): emails finished
        # steadily with a burst of failures, billing-sync has a backlog, reindex is paused.
        await pool.execute(
            "INSERT INTO jobs.job (queue, state, retry_limit, retry_delay, retry_backoff,"
            " expire_seconds, created_at, started_at, completed_at, output)"
            " SELECT 'emails', CASE WHEN g % 97 = 0"
            " OR (g % 13 = 0 AND g / 60 BETWEEN 38 AND 41) THEN 'failed' ELSE 'completed'"
            " END::jobs.job_state, 2, 0, false, 60, t, t, t,"
            ' CASE WHEN g % 97 = 0 THEN \'{"error": "SMTPError: 421 try later"}\'::jsonb END'
            " FROM generate_series(1, 3540) g,"
            " LATERAL (SELECT now() - make_interval(secs => 3540 - g"
            " + 20 * sin(g / 300.0))) s (t)"
        )
        await pool.execute(
            "INSERT INTO jobs.job (queue, retry_limit, retry_delay, retry_backoff,"
            " expire_seconds, created_at, start_after, data) SELECT 'billing-sync', 2, 0,"
            " false, 60, now() - interval '4 minutes', now() - interval '4 minutes',"
            " jsonb_build_object('account', g) FROM generate_series(1, 240) g"
        )
        await pool.execute("UPDATE jobs.queue SET paused = true WHERE name = 'reindex'")

    with installed_database(admin_url, template_name, prepare) as url:
        yield url


def insert_job(url: str, queue: str, state: str, data: Any, error: str | None = None) -> int:
    """A job row in ``state`` (finished now when terminal), with ``error`` as its last error."""
    output = json.dumps({"error": error}) if error is not None else None
    rows = fetch(
        url,
        "INSERT INTO jobs.job (queue, data, state, retry_limit, retry_count, retry_delay,"
        " retry_backoff, expire_seconds, completed_at, output, attempt) VALUES ($1,"
        " $2::text::jsonb, $3::text::jobs.job_state, 0, 1, 0, false, 60,"
        " CASE WHEN $3 IN ('completed', 'failed', 'cancelled') THEN now() END,"
        " $4::text::jsonb, 1) RETURNING id",
        queue,
        json.dumps(data),
        state,
        output,
    )
    return int(rows[0]["id"])


@pytest.fixture(scope="module")
def console(shared_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """An api process serving the console, job data shown (to prove it is escaped)."""
    with ready_daemon(
        shared_db,
        tmp_path_factory.mktemp("console"),
        role="api",
        env={"ADMIN_TOKEN": ADMIN, "CONSOLE_VIEW_TOKEN": VIEWER, "ADMIN_SHOW_DATA": "true"},
        name="console",
    ) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module."""
    sync_playwright = _browser_or_skip()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def session(browser: Any, token: str) -> tuple[Any, Any, list[str]]:
    """A browser context logged in with ``token`` (HTTP Basic), a page, and the dialogs seen
    on it (Playwright would otherwise dismiss them silently)."""
    context = browser.new_context(
        http_credentials={"username": "ops", "password": token},
        viewport={"width": 1280, "height": 860},
    )
    page = context.new_page()
    dialogs: list[str] = []

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    return context, page, dialogs


def shot(page: Any, name: str) -> None:
    """Save a full-page screenshot as a test artifact."""
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_admin_filters_failed_jobs_and_retries_them_through_the_confirmation(
    console: Daemon, shared_db: str, browser: Any
) -> None:
    """Log in, open the overview, filter the failed jobs of a queue, retry them all through the
    confirmation page (which shows the count first): the database shows them waiting."""
    failed = [
        insert_job(shared_db, "reports", "failed", {"n": n}, "TimeoutError: hub") for n in range(3)
    ]
    context, page, dialogs = session(browser, ADMIN)
    try:
        page.goto(console.url("/console/"))
        assert page.title().startswith("Queues")
        assert page.locator("td", has_text="reports").count() >= 1
        assert page.locator("svg.chart").count() == 1
        shot(page, "overview")
        page.click("text=Jobs")
        page.select_option("select[name=queue]", "reports")
        page.select_option("select[name=state]", "failed")
        page.click("button:has-text('Filter')")
        rows = page.locator("tbody tr")
        assert rows.count() == 3
        shot(page, "failed-jobs")
        page.click("text=Retry all matching")
        assert "This will retry 3 jobs" in page.inner_text(".notice")
        shot(page, "confirm-retry")
        assert [
            r["s"]
            for r in fetch(
                shared_db, "SELECT state::text AS s FROM jobs.job WHERE id = ANY($1)", failed
            )
        ] == ["failed"] * 3
        page.click("button:has-text('Yes, retry 3')")
        assert "3 job(s) changed" in page.inner_text(".notice")
        shot(page, "retried")
    finally:
        context.close()
    states = fetch(shared_db, "SELECT state::text AS s FROM jobs.job WHERE id = ANY($1)", failed)
    assert [r["s"] for r in states] == ["retry"] * 3
    [row] = fetch(
        shared_db,
        "SELECT actor_via, principal, action, metadata::text AS m FROM public.audit_log"
        " WHERE action = 'job.retry' ORDER BY id DESC LIMIT 1",
    )
    assert (row["actor_via"], row["principal"], row["action"]) == ("console", "admin", "job.retry")
    assert json.loads(row["m"])["count"] == 3
    assert dialogs == []


def test_hostile_data_and_errors_show_as_text_and_never_run(
    console: Daemon, shared_db: str, browser: Any
) -> None:
    """A job whose data and error hold <script> and <img onerror> shows them as text on the job
    page and the list; no script runs (no dialog), and no such element enters the page."""
    job_id = insert_job(shared_db, "reports", "failed", XSS_DATA, XSS_ERROR)
    context, page, dialogs = session(browser, ADMIN)
    try:
        page.goto(console.url(f"/console/jobs/{job_id}"))
        text = page.inner_text("main")
        assert XSS_ERROR in text
        assert XSS_DATA["note"] in text
        assert page.locator("main script").count() == 0
        assert page.locator("main img").count() == 0
        shot(page, "hostile-job")
        page.goto(console.url("/console/jobs?queue=reports&state=failed"))
        assert page.locator("main img").count() == 0
        page.wait_for_timeout(300)
    finally:
        context.close()
    assert dialogs == []


def test_the_view_token_sees_no_actions_and_a_forged_post_is_refused(
    console: Daemon, shared_db: str, browser: Any
) -> None:
    """A viewer sees the pages without any action button, and a POST made with the viewer's
    credentials (even with a valid-looking form) is refused; nothing changes."""
    job_id = insert_job(shared_db, "reports", "failed", {"n": 1}, "boom")
    context, page, _ = session(browser, VIEWER)
    try:
        page.goto(console.url(f"/console/jobs/{job_id}"))
        assert "read only" in page.inner_text("header")
        assert page.locator("main a.button, main button").count() == 0
        page.goto(console.url("/console/jobs?queue=reports"))
        assert page.locator("text=all matching").count() == 0
        shot(page, "viewer-job-list")
        forged = page.request.post(
            console.url("/console/act"),
            form={"kind": "job", "action": "retry", "id": str(job_id), "csrf": "1.x"},
            headers={"Origin": console.url("")},
        )
        assert forged.status == 403
    finally:
        context.close()
    assert (
        fetch(shared_db, "SELECT state::text AS s FROM jobs.job WHERE id = $1", job_id)[0]["s"]
        == "failed"
    )


def test_a_post_without_a_valid_csrf_token_or_from_another_origin_is_refused(
    console: Daemon, shared_db: str, browser: Any
) -> None:
    """With the admin's credentials, a POST lacking the form's token, or carrying one but sent
    from another origin, is refused and changes nothing."""
    job_id = insert_job(shared_db, "reports", "failed", {"n": 2}, "boom")
    context, page, _ = session(browser, ADMIN)
    try:
        page.goto(console.url(f"/console/confirm?kind=job&action=retry&id={job_id}"))
        token = page.get_attribute("input[name=csrf]", "value")
        own = console.url("").rstrip("/")
        no_token = page.request.post(
            console.url("/console/act"),
            form={"kind": "job", "action": "retry", "id": str(job_id)},
            headers={"Origin": own},
        )
        assert no_token.status == 403
        elsewhere = page.request.post(
            console.url("/console/act"),
            form={"kind": "job", "action": "retry", "id": str(job_id), "csrf": token},
            headers={"Origin": "https://evil.example"},
        )
        assert elsewhere.status == 403
    finally:
        context.close()
    assert (
        fetch(shared_db, "SELECT state::text AS s FROM jobs.job WHERE id = $1", job_id)[0]["s"]
        == "failed"
    )
