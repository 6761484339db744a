"""The purges through the real daemon: a job sent to a purge queue runs on a worker process."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import asyncpg

from api_sender import Sender
from tests.support.processes import run_cli, start_daemon
from worker.jobs.purges import AUDIT_PURGE_QUEUE, IDEMPOTENCY_PURGE_QUEUE, ORPHAN_USER_PURGE_QUEUE

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


async def _waiting_on_locks(pool: asyncpg.Pool) -> int:
    value: int = await pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    return value


async def test_two_workers_never_run_one_purge_beside_itself(
    db_url: str, pool: asyncpg.Pool, sender: Sender, tmp_path: Path
) -> None:
    """Two worker processes and two due jobs of one purge queue, one keyed as a cron slot and
    one sent by hand: while the first run is stalled on a row the app holds, the second does
    not start, and the two recorded runs never overlap."""
    await pool.execute(
        "INSERT INTO public.idempotency_keys (workspace_id, key, response, expires_at) "
        "SELECT 'w1', 'k' || g, '{}', now() - interval '1 day' FROM generate_series(1, 3) g"
    )
    holder = await asyncpg.connect(db_url)
    daemons = [start_daemon(db_url, tmp_path, name=f"w{i}") for i in range(2)]
    try:
        for daemon in daemons:
            await anyio.to_thread.run_sync(daemon.wait_ready, 60)
        await holder.execute("BEGIN")
        await holder.execute("SELECT 1 FROM public.idempotency_keys WHERE key = 'k1' FOR UPDATE")
        sent = [
            await sender.send(
                IDEMPOTENCY_PURGE_QUEUE, {}, singleton_key="cron:2026-01-01T03:00:00Z"
            ),
            await sender.send(IDEMPOTENCY_PURGE_QUEUE, {}),
        ]
        job_ids = [j for j in sent if j is not None]
        assert len(job_ids) == 2
        # Both jobs claimed, one per worker, and both runs waiting: the first on the held row,
        # the second on that row too (overlapping) or on the first run (serialised).
        with anyio.fail_after(30):
            while True:
                active = await pool.fetchval(
                    "SELECT count(*) FROM jobs.job WHERE id = ANY($1::bigint[]) "
                    "AND state = 'active'",
                    job_ids,
                )
                if active == 2 and await _waiting_on_locks(pool) >= 2:
                    break
                await anyio.sleep(0.05)
        owners = await pool.fetchval(
            "SELECT count(DISTINCT locked_by) FROM jobs.job WHERE id = ANY($1::bigint[])", job_ids
        )
        assert owners == 2, "both jobs ran in one process"
        await holder.execute("COMMIT")
        await _wait_completed(pool, job_ids, timeout=60)
    finally:
        await holder.close()
        for daemon in daemons:
            daemon.stop()

    runs = await pool.fetch(
        "SELECT started_at, finished_at FROM jobs.purge_run WHERE queue = $1 ORDER BY started_at",
        IDEMPOTENCY_PURGE_QUEUE,
    )
    assert len(runs) == 2
    first, second = runs
    assert first["finished_at"] <= second["started_at"], "two runs of one purge overlapped"
