"""``chassis-worker jobs ...`` and ``queues pause|resume|purge`` through the real CLI."""

from __future__ import annotations

import getpass
import json

import asyncpg
import pytest

from api_sender import Sender
from tests.support.processes import run_cli
from tests.support.queues import make_queue

pytestmark = pytest.mark.slow


async def failed(pool: asyncpg.Pool, sender: Sender, n: int, queue: str = "q") -> list[int]:
    """``n`` jobs of ``queue`` in state failed."""
    ids = await sender.send_many(queue, [{"n": i, "secret": "kept"} for i in range(n)])
    await pool.execute(
        "UPDATE jobs.job SET state = 'failed', completed_at = now(),"
        ' output = \'{"error": "boom"}\' WHERE id = ANY($1)',
        ids,
    )
    return ids


async def test_list_and_show_print_jobs_with_their_data(
    db_url: str, pool: asyncpg.Pool, sender: Sender
) -> None:
    """jobs list --json pages newest first; jobs show --json has every field and the data."""
    await make_queue(pool, "q")
    ids = await failed(pool, sender, 3)
    listed = run_cli(db_url, "jobs", "list", "--queue", "q", "--limit", "2", "--json")
    assert listed.returncode == 0, listed.stderr
    page = json.loads(listed.stdout)
    assert [j["id"] for j in page["jobs"]] == sorted(ids, reverse=True)[:2]
    assert page["next"] is not None
    shown = run_cli(db_url, "jobs", "show", str(ids[0]), "--json")
    job = json.loads(shown.stdout)
    assert (job["state"], job["error"], job["data"]) == (
        "failed",
        "boom",
        {"n": 0, "secret": "kept"},
    )
    assert run_cli(db_url, "jobs", "show", "999999").returncode == 1


async def test_a_filter_action_needs_yes_and_then_writes_one_audit_row(
    db_url: str, pool: asyncpg.Pool, sender: Sender
) -> None:
    """Without --yes the CLI prints the count and changes nothing; with it, it retries them and
    records the OS user."""
    await make_queue(pool, "q")
    ids = await failed(pool, sender, 4)
    dry = run_cli(db_url, "jobs", "retry", "--queue", "q", "--state", "failed")
    assert dry.returncode == 0, dry.stderr
    assert "would retry 4 job(s)" in dry.stdout
    assert await pool.fetchval("SELECT count(*) FROM jobs.job WHERE state = 'failed'") == 4
    assert await pool.fetchval("SELECT count(*) FROM public.audit_log") == 0
    live = run_cli(db_url, "jobs", "retry", "--queue", "q", "--state", "failed", "--yes")
    assert "retried 4 job(s)" in live.stdout
    assert await pool.fetchval("SELECT count(*) FROM jobs.job WHERE state = 'retry'") == 4
    [row] = await pool.fetch("SELECT actor_via, principal, action FROM public.audit_log")
    assert tuple(row.values()) == ("cli", getpass.getuser(), "job.retry")
    by_ids = run_cli(db_url, "jobs", "cancel", str(ids[0]), str(ids[1]))
    assert by_ids.stdout.splitlines()[0] == "cancelled 2 of 2 job(s)"


@pytest.mark.parametrize(
    "argv",
    [
        ["jobs", "retry"],
        ["jobs", "retry", "12", "--queue", "q"],
        ["jobs", "retry", "abc"],
        ["jobs", "delete", "12", "--yes"],
        ["jobs", "cancel", "--queue", "q", "--since", "yesterday"],
        ["jobs", "list", "--state", "done"],
    ],
)
async def test_bad_arguments_exit_2_with_one_line(db_url: str, argv: list[str]) -> None:
    """A wrong combination or value exits 2, its last line on stderr naming the problem, and
    prints nothing on stdout."""
    result = run_cli(db_url, *argv)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    assert result.stderr.strip().splitlines()[-1]


async def test_queue_pause_resume_purge_and_queues_json_shows_paused(
    db_url: str, pool: asyncpg.Pool, sender: Sender
) -> None:
    """pause shows in `queues --json`; purge without --yes counts, with --yes deletes."""
    await make_queue(pool, "q")
    await sender.send_many("q", [{}, {}])
    assert run_cli(db_url, "queues", "pause", "q").stdout.strip() == "q paused"
    report = json.loads(run_cli(db_url, "queues", "--json").stdout)
    assert next(q for q in report["queues"] if q["name"] == "q")["paused"] is True
    assert "would purge 2" in run_cli(db_url, "queues", "purge", "q").stdout
    assert await pool.fetchval("SELECT count(*) FROM jobs.job") == 2
    assert "purged 2" in run_cli(db_url, "queues", "purge", "q", "--yes").stdout
    assert await pool.fetchval("SELECT count(*) FROM jobs.job") == 0
    assert run_cli(db_url, "queues", "resume", "q").stdout.strip() == "q resumed"
    actions = await pool.fetch("SELECT action FROM public.audit_log ORDER BY id")
    assert [r["action"] for r in actions] == ["queue.pause", "queue.purge", "queue.resume"]
