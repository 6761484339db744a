"""The CLI's human output never hands a terminal control sequence from a job, a queue or a held
event to the operator's terminal (issue 28 item 12); ``--json`` stays exact JSON."""

from __future__ import annotations

import json
import re

import asyncpg
import pytest

from api_sender import USAGE_HELD_QUEUE, Sender, UsageEvent
from tests.support.processes import run_cli
from tests.support.queues import make_queue
from tests.usage.conftest import install_usage, usage_settings

pytestmark = pytest.mark.slow

#: Erase the screen, set the window title (OSC ... BEL), a C1 CSI, DEL, a bidi override.
HOSTILE = "\x1b[2J\x1b]0;owned\x07\u009b31m\x7f\u202eboom\r"
#: Whatever a terminal could act on: C0 controls but newline, DEL, C1 controls, bidi controls.
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


async def hostile_job(pool: asyncpg.Pool, sender: Sender) -> int:
    """A failed job whose key, data and error text hold terminal control sequences."""
    await make_queue(pool, "q")
    job_id = await sender.send("q", {"note": HOSTILE, HOSTILE: 1}, singleton_key="k" + HOSTILE)
    await pool.execute(
        "UPDATE jobs.job SET state = 'failed', completed_at = now(),"
        " output = jsonb_build_object('error', $2::text) WHERE id = $1",
        job_id,
        f"first line {HOSTILE}\nsecond line {HOSTILE}",
    )
    assert job_id is not None
    return job_id


def _safe(stdout: str) -> None:
    found = CONTROL.findall(stdout)
    assert not found, (found, stdout)


async def test_jobs_show_escapes_every_untrusted_field(
    db_url: str, pool: asyncpg.Pool, sender: Sender
) -> None:
    """jobs show prints the error, the key and the data with control characters as visible
    escapes (the error keeps its line breaks), so nothing reaches the terminal raw."""
    job_id = await hostile_job(pool, sender)
    shown = run_cli(db_url, "jobs", "show", str(job_id))
    assert shown.returncode == 0, shown.stderr
    _safe(shown.stdout)
    assert "\\x1b[2J\\x1b]0;owned\\x07\\u009b31m\\x7f\\u202eboom\\x0d" in shown.stdout
    assert "first line" in shown.stdout
    assert "second line" in shown.stdout.split("first line", 1)[1].splitlines()[1]


async def test_jobs_list_escapes_every_untrusted_field(
    db_url: str, pool: asyncpg.Pool, sender: Sender
) -> None:
    """jobs list prints keys and error summaries with control characters escaped."""
    await hostile_job(pool, sender)
    listed = run_cli(db_url, "jobs", "list")
    assert listed.returncode == 0, listed.stderr
    _safe(listed.stdout)
    assert "k\\x1b[2J" in listed.stdout
    assert "first line \\x1b[2J" in listed.stdout


async def test_json_output_is_unchanged_by_the_escaping(
    db_url: str, pool: asyncpg.Pool, sender: Sender
) -> None:
    """--json output carries the exact texts (JSON's own escapes keep it terminal-safe)."""
    job_id = await hostile_job(pool, sender)
    shown = run_cli(db_url, "jobs", "show", str(job_id), "--json")
    job = json.loads(shown.stdout)
    assert job["error"] == f"first line {HOSTILE}\nsecond line {HOSTILE}"
    assert job["singleton_key"] == "k" + HOSTILE
    assert job["data"] == {"note": HOSTILE, HOSTILE: 1}
    listed = json.loads(run_cli(db_url, "jobs", "list", "--json").stdout)
    assert listed["jobs"][0]["error"] == job["error"]
    assert "\x1b" not in shown.stdout


async def test_queues_table_escapes_a_hostile_cron_text(db_url: str, pool: asyncpg.Pool) -> None:
    """The queues table prints a schedule's text with control characters escaped."""
    await make_queue(pool, "q")
    await pool.execute("INSERT INTO jobs.schedule (queue, cron) VALUES ('q', $1)", HOSTILE)
    result = run_cli(db_url, "queues")
    assert result.returncode == 0, result.stderr
    _safe(result.stdout)
    assert "\\x1b[2J" in result.stdout


async def test_held_list_escapes_a_hostile_event(db_url: str, pool: asyncpg.Pool) -> None:
    """held list prints an event's meter and workspace (ingested text) with control characters
    escaped; its --json keeps them exact."""
    settings = usage_settings(db_url)
    await install_usage(pool, settings)
    sender = Sender(pool, usage_retry=settings.usage_retry)
    event = UsageEvent("m" + HOSTILE, 1, "w" + HOSTILE)
    await sender.send(USAGE_HELD_QUEUE, event.to_job_data())
    table = run_cli(db_url, "held", "list")
    assert table.returncode == 0, table.stderr
    _safe(table.stdout)
    assert "m\\x1b[2J" in table.stdout
    listing = json.loads(run_cli(db_url, "held", "list", "--json").stdout)
    assert listing["held"][0]["meter"] == event.to_job_data()["meter"]
