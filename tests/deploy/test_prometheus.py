"""config/prometheus.yml and config/alerts.yml checked by promtool and against a live /metrics."""

from __future__ import annotations

import asyncio
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

from api_sender import Sender, create_pool
from tests.deploy.files import CONFIG, ROOT
from tests.support.processes import start_daemon
from tests.support.queues import make_queue
from tests.support.tools import require_tool

ALERTS = CONFIG / "alerts.yml"
ALERT_TESTS = Path(__file__).with_name("alerts_test.yml")

#: PromQL words that are not metric names.
PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}
#: Series Prometheus makes itself.
SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


@pytest.fixture
def promtool() -> str:
    """The promtool binary (Debian's prometheus package brings it); CI fails without it."""
    hint = "or put promtool from https://prometheus.io/download/ on PATH"
    return require_tool("promtool", "prometheus", hint=hint)


def run_promtool(
    binary: str, *args: str, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run promtool from the repository root."""
    return subprocess.run(
        [binary, *args], input=stdin, capture_output=True, cwd=ROOT, timeout=60, check=False
    )


def alert_expressions() -> dict[str, str]:
    """Each alert's name and PromQL expression."""
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def metric_names(expression: str) -> set[str]:
    """The metric names a PromQL expression reads."""
    text = re.sub(r'"[^"]*"', "", expression)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", text))
    return {n for n in names if n.lower() not in PROMQL_WORDS and not n[0].isdigit()}


def test_alerts_cover_the_promised_signals() -> None:
    """There are alerts on held usage by reason, oldest waiting job age, failed jobs, readiness,
    scrape health and lease-lost writes."""
    used = set().union(*(metric_names(e) for e in alert_expressions().values()))
    for metric in (
        "usage_events_held_total",
        "queue_oldest_waiting_seconds",
        "jobs_failed_total",
        "worker_ready",
        "up",
        "jobs_lease_lost_total",
    ):
        assert metric in used, metric
    held = [e for e in alert_expressions().values() if "usage_events_held_total" in e]
    assert {"retry_budget", "occurred_at_window"} <= {
        r for e in held for r in re.findall(r'reason="(\w+)"', e)
    }


def test_alerts_name_scrape_jobs_that_exist() -> None:
    """Every job an alert selects (job="..." or job=~"a|b") is a scrape job of prometheus.yml."""
    config = yaml.safe_load((CONFIG / "prometheus.yml").read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    selected = set()
    for expression in alert_expressions().values():
        for value in re.findall(r'\bjob=~?"([^"]*)"', expression):
            selected.update(value.split("|"))
    assert selected, "the availability alerts select the chassis scrape jobs"
    assert selected <= jobs, f"alerts select jobs nobody scrapes: {sorted(selected - jobs)}"


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
async def test_alerts_read_metrics_a_live_daemon_serves(db_url: str, tmp_path) -> None:
    """Every metric an alert reads is exposed by a running worker's /metrics (a renamed metric
    would leave its alert silent forever)."""
    text = await scrape_worker(db_url, tmp_path)
    exposed = set(re.findall(r"^# TYPE (\S+) ", text, flags=re.MULTILINE))
    # The text format names a counter's family without _total in some clients; accept both.
    exposed |= {f"{name}_total" for name in exposed}
    for alert, expression in alert_expressions().items():
        missing = metric_names(expression) - exposed - SYNTHETIC
        assert not missing, f"{alert} reads metrics nobody serves: {sorted(missing)}"


async def scrape_worker(db_url: str, tmp_path: Path) -> str:
    """Boot a worker, wait until ready, and return one /metrics scrape."""
    daemon = start_daemon(db_url, tmp_path, role="worker", name="metrics")
    try:
        await asyncio.to_thread(daemon.wait_ready, 30)
        with urllib.request.urlopen(daemon.url("/metrics"), timeout=5) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            body: str = response.read().decode()
        assert daemon.stop() == 0
        return body
    finally:
        daemon.kill()


def test_promtool_checks_the_prometheus_config(promtool: str) -> None:
    """promtool accepts config/prometheus.yml, including the rule files it names."""
    done = run_promtool(promtool, "check", "config", "config/prometheus.yml")
    assert done.returncode == 0, (done.stdout + done.stderr).decode()
    assert b"1 rule files found" in done.stdout


def test_promtool_checks_the_alert_rules(promtool: str) -> None:
    """promtool accepts config/alerts.yml."""
    done = run_promtool(promtool, "check", "rules", "config/alerts.yml")
    assert done.returncode == 0, (done.stdout + done.stderr).decode()
    assert f"{len(alert_expressions())} rules found".encode() in done.stdout


def test_promtool_alert_unit_tests_pass(promtool: str) -> None:
    """The alert rules fire, and stay quiet, as tests/deploy/alerts_test.yml says."""
    done = run_promtool(promtool, "test", "rules", str(ALERT_TESTS.relative_to(ROOT)))
    assert done.returncode == 0, (done.stdout + done.stderr).decode()
    tested = set(re.findall(r"alertname: (\w+)", ALERT_TESTS.read_text()))
    untested = set(alert_expressions()) - tested
    assert not untested, f"alerts without a unit test: {sorted(untested)}"


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
async def test_promtool_checks_a_live_metrics_scrape(promtool: str, db_url: str, tmp_path) -> None:
    """promtool finds nothing to complain about in a running worker's /metrics."""
    text = await scrape_worker(db_url, tmp_path)
    done = run_promtool(promtool, "check", "metrics", stdin=text.encode())
    assert done.returncode == 0, (done.stdout + done.stderr).decode()
    assert done.stdout.strip() == b"", done.stdout.decode()


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in a scrape, or None."""
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            series, _, value = line.rpartition(" ")
            found = dict(re.findall(r'(\w+)="([^"]*)"', series))
            if all(found.get(k) == v for k, v in labels.items()):
                return float(value)
    return None


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
async def test_queue_gauges_show_a_waiting_job(db_url: str, tmp_path) -> None:
    """A due job on a queue no worker consumes shows in a running worker's queue_jobs and
    queue_oldest_waiting_seconds, which the backlog alerts read."""
    pool = await create_pool(db_url, max_size=2)
    try:
        await make_queue(pool, "unconsumed")
        await Sender(pool).send("unconsumed", {"waiting": True})
    finally:
        await pool.close()
    daemon = start_daemon(db_url, tmp_path, role="worker", name="gauges")
    try:
        await asyncio.to_thread(daemon.wait_ready, 30)
        waiting = count = None
        for _ in range(40):
            status, text = daemon.get("/metrics")
            assert status == 200
            waiting = sample(text, "queue_oldest_waiting_seconds", queue="unconsumed")
            count = sample(text, "queue_jobs", queue="unconsumed", state="created")
            if waiting and count:
                break
            await asyncio.sleep(0.25)
        assert count == 1
        assert waiting is not None
        assert waiting > 0
    finally:
        daemon.kill()
