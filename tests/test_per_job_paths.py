"""The worker's cheaper per-job paths say exactly what the plain ones say: the batched
job-duration histogram, the payload decode, the positional claim rows, the handler's JobInfo
and the job named on every log line of a handler (issue 14)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry, Histogram

from worker.declarations import JobInfo, job_info
from worker.metrics import DurationTally
from worker.queue.jobs import JOB_COLUMNS, ClaimedJob, claim_token, decode_payload
from worker.queue.sql import _JOB_COLUMNS
from worker.queue.store import _ordered

BUCKETS = (0.001, 0.005, 0.02, 0.1, 0.5, 2, 10, 60, 300)
AMOUNTS = [0.0, 1e-6, 0.001, 0.0010001, 0.005, 0.3, 2.0, 59.9, 300.0, 301.0, 1e9, -0.5]


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for metric in registry.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    }


def test_duration_tally_exposes_what_observe_does() -> None:
    plain_registry, tallied_registry = CollectorRegistry(), CollectorRegistry()
    plain = Histogram("d", "d", ["queue"], buckets=BUCKETS, registry=plain_registry)
    tallied = Histogram("d", "d", ["queue"], buckets=BUCKETS, registry=tallied_registry)
    tally = DurationTally(tallied.labels("q"))
    for amount in AMOUNTS:
        plain.labels("q").observe(amount)
        tally.observe(amount)
    assert _samples(tallied_registry)[("d_count", (("queue", "q"),))] == 0
    tally.flush()
    assert _samples(tallied_registry) == _samples(plain_registry)
    # Counted once: a second flush adds nothing, later observations add to the totals.
    tally.flush()
    for amount in AMOUNTS[:4]:
        plain.labels("q").observe(amount)
        tally.observe(amount)
    tally.flush()
    assert _samples(tallied_registry) == _samples(plain_registry)


@pytest.mark.parametrize(
    "text",
    ['{"n": 1}', "null", "[]", '"x"', "1.5", ' {"a": 1}', '{"a": 1} ', '{"a": "\\u00e9"}'],
)
def test_decode_payload_is_json_loads(text: str) -> None:
    assert decode_payload(text) == json.loads(text)


@pytest.mark.parametrize("text", ["", " ", "{", '{"a": 1} x', "[1]]", "nul"])
def test_decode_payload_refuses_what_json_loads_refuses(text: str) -> None:
    with pytest.raises(json.JSONDecodeError) as ours:
        decode_payload(text)
    with pytest.raises(json.JSONDecodeError) as theirs:
        json.loads(text)
    assert str(ours.value) == str(theirs.value)


def test_claim_columns_are_in_the_positional_order() -> None:
    names = [part.split(" AS ")[-1].split(".")[-1].strip() for part in _JOB_COLUMNS.split(",")]
    assert tuple(names) == JOB_COLUMNS


def test_job_info_is_the_dataclass_built_the_plain_way() -> None:
    # Every field, in order: a field added to JobInfo must be added to job_info too.
    names = tuple(f.name for f in dataclasses.fields(JobInfo))
    assert names == ("id", "queue", "key", "attempt", "retry_count")
    for values in [(7, "q", "k", 2, 1), (1, "other", None, 1, 0)]:
        fast, plain = job_info(*values), JobInfo(*values)
        assert fast == plain
        assert hash(fast) == hash(plain)
        assert repr(fast) == repr(plain)
        assert dataclasses.asdict(fast) == dataclasses.asdict(plain)
        with pytest.raises(dataclasses.FrozenInstanceError):
            fast.attempt = 3  # type: ignore[misc]


def test_from_values_matches_from_row() -> None:
    values = (7, '{"n": 1}', 2, 1, 5, "k", 900, 3, claim_token(datetime.now(UTC)))
    by_name = ClaimedJob.from_row("q", dict(zip(JOB_COLUMNS, values, strict=True)))  # type: ignore[arg-type]
    assert ClaimedJob.from_values("q", values) == by_name


def test_every_line_a_handler_logs_names_its_job() -> None:
    """A line logged while a runner's job runs (and in a task it starts) names the job and its
    attempt; a line that names them itself keeps its own."""
    code = """
import sys, anyio, structlog
from worker.logging import CURRENT_JOB, configure_logging
configure_logging("info", "json", sys.stdout)
log = structlog.get_logger("t")
async def child():
    log.info("child")
async def main():
    log.info("before")
    CURRENT_JOB.set((41, 3))
    log.info("running")
    log.info("own", job_id=1, attempt=1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(child)
anyio.run(main)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    events = {e["event"]: e for e in map(json.loads, done.stdout.splitlines())}
    assert "job_id" not in events["before"]
    assert (events["running"]["job_id"], events["running"]["attempt"]) == (41, 3)
    assert (events["own"]["job_id"], events["own"]["attempt"]) == (1, 1)
    assert (events["child"]["job_id"], events["child"]["attempt"]) == (41, 3)


def test_claimed_jobs_run_in_priority_then_id_order() -> None:
    now = claim_token(datetime.now(UTC))
    keys = [(3, 0), (1, 5), (2, 0), (9, 5), (4, -1), (8, 0), (5, 5), (7, -1), (6, 0)]
    jobs = [ClaimedJob.from_values("q", (i, None, 1, 0, 0, None, 9, p, now)) for i, p in keys]
    ordered = _ordered(list(jobs))
    expected = sorted(jobs, key=lambda j: (-j.priority, j.id))
    assert [j.id for j in ordered] == [j.id for j in expected]
