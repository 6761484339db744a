"""`chassis-worker send` refuses what a handler or the usage pipeline could not take (exit 2)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import asyncpg
import pytest

from api_sender import UsageEvent
from tests.support.processes import run_cli

#: A plain queue the test installs by hand (no handler runs: only what is enqueued matters).
QUEUE = "plain"


@pytest.fixture
async def installed(db_url: str, tmp_path: Path) -> str:
    """The test database installed by `migrate`, plus the plain queue."""
    done = await asyncio.to_thread(run_cli, db_url, "migrate", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute("INSERT INTO jobs.queue (name) VALUES ($1)", QUEUE)
    finally:
        await conn.close()
    return db_url


async def _send(
    url: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run_cli, url, "send", *args, env=env)


async def _jobs(url: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetch(
            "SELECT queue, data::text AS data, singleton_key, retry_limit, retry_delay "
            "FROM jobs.job ORDER BY id"
        )
    finally:
        await conn.close()


def _refused(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ("[1, 2]", ("object",)),
        ('"text"', ("object",)),
        ("42", ("object",)),
        ("true", ("object",)),
        ('{"a": "nul \\u0000 here"}', ()),
        ('{"nul\\u0000key": 1}', ()),
        ('{"a": "\\ud800"}', ()),
    ],
)
async def test_send_refuses_data_a_handler_cannot_take(installed: str, data: str, words) -> None:
    """Non-object JSON, NUL characters and lone surrogates: exit 2, one line, nothing enqueued."""
    _refused(await _send(installed, QUEUE, data), *words)
    assert await _jobs(installed) == []


@pytest.mark.parametrize("seconds", ["1e308", "inf", "nan", "-1", "1e13"])
async def test_send_refuses_a_start_after_out_of_range(installed: str, seconds: str) -> None:
    """--start-after that is not a finite delay the database can add to now(): exit 2."""
    _refused(await _send(installed, QUEUE, "{}", f"--start-after={seconds}"), "--start-after")
    assert await _jobs(installed) == []


async def test_send_takes_an_object_or_null(installed: str) -> None:
    """An object and JSON null (a handler's ``dict | None``) are enqueued; the id is printed."""
    for data in ('{"k": 1}', "null"):
        result = await _send(installed, QUEUE, data, "--start-after", "30")
        assert result.returncode == 0, result.stderr
        assert int(result.stdout.strip()) > 0
    assert [json.loads(r["data"]) for r in await _jobs(installed)] == [{"k": 1}, None]


@pytest.mark.parametrize(
    ("event", "field"),
    [
        ('{"x": 1}', "meter"),
        ('{"meter": "m", "quantity": -1, "workspace_id": "w"}', "quantity"),
        ('{"meter": "m", "quantity": 1, "workspace_id": "w", "id": "nope"}', "id"),
        ('{"meter": "m", "quantity": 1, "workspace_id": "w", "occurred_at": "1"}', "occurred_at"),
        ('{"events": [{"meter": "m", "quantity": 1, "workspace_id": "w"}]}', "events"),
        ("[1]", "object"),
    ],
)
async def test_send_to_usage_events_refuses_an_invalid_event(
    installed: str, event: str, field: str
) -> None:
    """usage-events takes only what the ingest would: an invalid event is refused, not held."""
    _refused(await _send(installed, "usage-events", event), field)
    assert await _jobs(installed) == []


async def test_send_to_usage_events_enqueues_the_event_as_the_ingest_does(installed: str) -> None:
    """A valid event goes in like an ingested one: its id (generated) as key, the retry budget."""
    body = {"meter": "api.calls", "quantity": 2, "workspace_id": "w1"}
    result = await _send(
        installed, "usage-events", json.dumps(body), env={"USAGE_RETRY_LIMIT": "7"}
    )
    assert result.returncode == 0, result.stderr
    [job] = await _jobs(installed)
    data = json.loads(job["data"])
    assert UsageEvent.model_validate(data).to_job_data() == data
    assert {k: data[k] for k in body} == body
    assert job["queue"] == "usage-events"
    assert job["singleton_key"] == data["id"]
    assert job["retry_limit"] == 7


async def test_send_to_usage_events_refuses_a_key(installed: str) -> None:
    """--key on usage-events: refused (an event's key is its id)."""
    body = '{"meter": "m", "quantity": 1, "workspace_id": "w"}'
    _refused(await _send(installed, "usage-events", body, "--key", "k"), "--key")
    assert await _jobs(installed) == []


async def test_send_to_the_held_queue_is_refused(installed: str) -> None:
    """usage-events-held is the pipeline's dead letter: a send there is refused, pointing at
    usage-events."""
    body = '{"meter": "m", "quantity": 1, "workspace_id": "w"}'
    _refused(await _send(installed, "usage-events-held", body), "usage-events")
    assert await _jobs(installed) == []
