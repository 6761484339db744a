"""The purges through the real daemon: a job sent to a purge queue runs on a worker process."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import asyncpg

from api_sender import Sender
from tests.support.processes import run_cli, start_daemon
from worker.jobs.purges import AUDIT_PURGE_QUEUE, ORPHAN_USER_PURGE_QUEUE

from .chassis import DAY, add_audit_rows, add_membership, add_user, user_ids


async def _wait_completed(pool: asyncpg.Pool, job_ids: list[int], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = await pool.fetch(
            "SELECT state::text AS state, output FROM jobs.job WHERE id = ANY($1::bigint[])",
            job_ids,
        )
        if states and all(r["state"] == "completed" for r in states):
            return
        if any(r["state"] in ("failed", "retry") for r in states):
            raise AssertionError(f"purge job failed: {[dict(r) for r in states]}")
        await anyio.sleep(0.1)
    raise AssertionError(f"purge jobs not completed after {timeout}s")


async def test_a_worker_runs_hand_sent_purge_jobs_and_queues_shows_them(
    db_url: str, pool: asyncpg.Pool, sender: Sender, tmp_path: Path
) -> None:
    """A worker started with both retentions set deletes the old audit rows and the orphan of
    jobs sent to their queues, logs purge.ran for each, and `queues --json` shows the runs."""
    async with pool.acquire() as conn:
        await add_audit_rows(conn, 6_000, age=40 * DAY)
        await add_audit_rows(conn, 5, age=DAY)
        await add_user(conn, email="orphan@example.com")
        member = await add_user(conn)
        await add_membership(conn, member)
    env = {"AUDIT_RETENTION_DAYS": "30", "ORPHAN_USER_RETENTION_HOURS": "24"}
    daemon = start_daemon(db_url, tmp_path, role="worker", env=env)
    try:
        daemon.wait_ready()
        job_ids = [
            await sender.send(AUDIT_PURGE_QUEUE, {}),
            await sender.send(ORPHAN_USER_PURGE_QUEUE, {}),
        ]
        await _wait_completed(pool, [j for j in job_ids if j is not None])
    finally:
        assert daemon.stop() == 0

    assert (
        await pool.fetchval(
            "SELECT count(*) FROM public.audit_log WHERE action <> 'user.orphan_purge'"
        )
        == 5
    )
    async with pool.acquire() as conn:
        assert await user_ids(conn) == {member}
    ran = {e["queue"]: e for e in daemon.events() if e.get("event") == "purge.ran"}
    assert ran[AUDIT_PURGE_QUEUE]["deleted"] == 6_000
    assert ran[ORPHAN_USER_PURGE_QUEUE]["deleted"] == 1
    shown = run_cli(db_url, "queues", "--json")
    assert shown.returncode == 0, shown.stderr
    report = {q["name"]: q for q in json.loads(shown.stdout)["queues"]}
    assert report[AUDIT_PURGE_QUEUE]["last_purge"]["deleted"] == 6_000
    assert report[ORPHAN_USER_PURGE_QUEUE]["last_purge"]["deleted"] == 1
    table = run_cli(db_url, "queues")
    assert "last_purge" in table.stdout.splitlines()[0]
    assert "(6000 rows)" in table.stdout
