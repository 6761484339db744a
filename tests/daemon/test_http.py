"""The operational HTTP surface of a running daemon."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from api_sender import Sender, create_pool
from tests.support.ledger import create_ledger, done_counts
from tests.support.processes import start_daemon
from tests.support.queues import make_queue

#: One daemon per test, on its own database: no turn needed among the multi-process tests.
pytestmark = [pytest.mark.slow]


async def test_metrics_health_and_worker_404_on_v1(db_url: str, tmp_path) -> None:
    """A worker serves /healthz, /readyz and /metrics with the promised series; /v1 is 404."""
    daemon = start_daemon(db_url, tmp_path, env={"TOOL_JOBS": "tests.support.tooljobs:TIMERS"})
    try:
        await asyncio.to_thread(daemon.wait_ready, 60)
        async with Sender.connect(db_url, max_size=1) as sender:
            await sender.send("tool-timer", {}, start_after=3600)
        assert daemon.get("/healthz")[0] == 200
        assert daemon.get("/readyz") == (200, {"ready": True})
        status, text = daemon.get("/metrics")
        assert status == 200
        for name in (
            "usage_events_held_total",
            "usage_events_delivered_total",
            "jobs_completed_total",
            "jobs_failed_total",
            "queue_jobs",
            "queue_oldest_waiting_seconds",
        ):
            assert f"# TYPE {name}" in text
        assert 'queue_jobs{queue="tool-timer",state="created"} 1.0' in text
        assert daemon.get("/v1/usage-events")[0] == 404
    finally:
        daemon.kill()


async def test_readyz_recovers_after_every_backend_is_terminated(db_url, admin_url, tmp_path):
    """pg_terminate_backend on every daemon connection: /readyz recovers by itself and new
    work is still picked up (the LISTEN connection comes back)."""
    await create_ledger(db_url)
    daemon = start_daemon(db_url, tmp_path, env={"TOOL_JOBS": "tests.support.tooljobs:WORK"})
    try:
        await asyncio.to_thread(daemon.wait_ready, 60)
        admin = await asyncpg.connect(admin_url)
        try:
            dbname = db_url.rsplit("/", 1)[1]
            killed = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = $1 AND pid <> pg_backend_pid()",
                dbname,
            )
        finally:
            await admin.close()
        assert killed >= 2
        await asyncio.to_thread(daemon.wait_ready, 30)
        async with Sender.connect(db_url, max_size=1) as sender:
            job_id = await sender.send("tool-work", {"n": 1})
        for _ in range(100):
            if await done_counts(db_url, "tool-work") == {job_id: 1}:
                break
            await asyncio.sleep(0.1)
        assert await done_counts(db_url, "tool-work") == {job_id: 1}
        assert any(
            e["event"] == "listener.reconnected" or e["event"] == "listener.lost"
            for e in daemon.events()
        )
    finally:
        daemon.kill()


async def test_a_database_closed_to_connections_is_waited_out(db_url, admin_url, tmp_path):
    """ALLOW_CONNECTIONS false, then true again: the worker waits (503) and recovers, not exits."""
    daemon = start_daemon(db_url, tmp_path)
    dbname = db_url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(admin_url)
    try:
        await asyncio.to_thread(daemon.wait_ready, 60)
        await admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", dbname
        )
        for _ in range(100):
            if daemon.get("/readyz")[0] == 503:
                break
            await asyncio.sleep(0.1)
        assert daemon.get("/readyz")[0] == 503
        await asyncio.sleep(2)
        assert daemon.process.poll() is None, daemon.logs()
        await admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
        await asyncio.to_thread(daemon.wait_ready, 30)
    finally:
        await admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
        await admin.close()
        daemon.kill()


async def test_a_scrape_answers_while_the_count_waits_and_its_result_lands_after(
    db_url: str, tmp_path
) -> None:
    """With the counters locked by another session the queue count cannot finish, yet /metrics
    answers (without the queue's series yet, logging metrics.count_pending); once the lock goes,
    the count that waited sets the gauges, seen at once by the next scrapes."""
    pool = await create_pool(db_url, max_size=2)
    try:
        await make_queue(pool, "unconsumed")
        await Sender(pool).send("unconsumed", {})
    finally:
        await pool.close()
    daemon = start_daemon(db_url, tmp_path)
    locker = await asyncpg.connect(db_url)
    try:
        await asyncio.to_thread(daemon.wait_ready, 60)
        waiting = 'queue_jobs{queue="unconsumed",state="created"} 1.0'
        async with locker.transaction():
            await locker.execute("LOCK TABLE jobs.job_count IN ACCESS EXCLUSIVE MODE")
            status, text = await asyncio.to_thread(daemon.get, "/metrics", 10.0)
            assert status == 200
            assert waiting not in text
            assert any(e["event"] == "metrics.count_pending" for e in daemon.events())
        for _ in range(15):
            status, text = await asyncio.to_thread(daemon.get, "/metrics")
            if waiting in text:
                break
            await asyncio.sleep(0.1)
        assert waiting in text
    finally:
        await locker.close()
        daemon.kill()
