"""The operational HTTP surface of a running daemon."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import asyncpg
import httpx
import pytest

from api_sender import Sender, create_pool
from tests.support.ledger import create_ledger, done_counts
from tests.support.postgres import create_database, drop_database, with_database
from tests.support.processes import Daemon, run_cli, start_daemon
from tests.support.queues import make_queue
from tests.support.rawhttp import exchange, request_head

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


# --- Slow and broken clients (issue 10, C14) ---------------------------------------------------

TOKEN = "test-http-token"
#: The bounds the slow-client daemon runs with; every wait below is a few times these.
HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 2.0
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def slow_api(admin_url: str, template_name: str, tmp_path_factory) -> Iterator[tuple[Daemon, str]]:
    """An installed database with queue "reports" and an api process with short header and
    body timeouts."""
    name = asyncio.run(create_database(admin_url, template_name))
    url = with_database(admin_url, name)
    assert run_cli(url, "migrate").returncode == 0

    async def queue() -> None:
        pool = await create_pool(url, max_size=1)
        try:
            await make_queue(pool, "reports")
        finally:
            await pool.close()

    asyncio.run(queue())
    daemon = start_daemon(
        url,
        tmp_path_factory.mktemp("slow-api"),
        role="api",
        env={
            "INGEST_TOKEN": TOKEN,
            "HTTP_HEADER_TIMEOUT_SECONDS": str(HEADER_TIMEOUT),
            "HTTP_BODY_TIMEOUT_SECONDS": str(BODY_TIMEOUT),
        },
    )
    try:
        daemon.wait_ready(60)
        yield daemon, url
    finally:
        daemon.stop()
        asyncio.run(drop_database(admin_url, name))


def _job_head(length: int | None = None, **extra: str) -> bytes:
    headers = {**AUTH, "Content-Type": "application/json", **extra}
    if length is not None:
        headers["Content-Length"] = str(length)
    return request_head("POST", "/v1/jobs/reports", headers)


def test_a_silent_connection_is_closed(slow_api: tuple[Daemon, str]) -> None:
    """A connection that never sends a byte is closed once the header timeout passes."""
    daemon, _ = slow_api
    answer = exchange(daemon.port, [], timeout=HEADER_TIMEOUT + 10)
    assert not answer.hung, "the server kept a silent connection open"
    assert answer.closed


def test_a_header_sent_byte_by_byte_gets_408(slow_api: tuple[Daemon, str]) -> None:
    """Request headers dribbled in slower than the header timeout allows answer 408 and the
    connection is closed."""
    daemon, _ = slow_api
    head = _job_head(12)
    answer = exchange(
        daemon.port, [head[i : i + 1] for i in range(len(head))], pause=0.2, timeout=30
    )
    assert not answer.hung, "the server waited on a slow header"
    assert answer.status == 408, answer
    assert answer.closed


def test_a_body_that_stalls_gets_408_naming_it(slow_api: tuple[Daemon, str]) -> None:
    """A body that stops arriving before its Content-Length answers 408 (JSON, naming the
    body) within the body timeout and closes; nothing is enqueued."""
    daemon, url = slow_api
    before = _count(url)
    answer = exchange(daemon.port, [_job_head(100) + b'{"data": {'], timeout=BODY_TIMEOUT + 10)
    assert not answer.hung, "the server waited on a stalled body"
    assert answer.status == 408, answer
    assert "body" in answer.json()["error"]
    assert answer.closed
    assert _count(url) == before


def test_a_body_dribbled_slowly_gets_408(slow_api: tuple[Daemon, str]) -> None:
    """A body arriving a byte at a time, each byte inside any idle limit, is still bounded in
    total: 408 once the body timeout has passed."""
    daemon, _ = slow_api
    body = b'{"data": {"x": "' + b"y" * 200 + b'"}}'
    parts = [_job_head(len(body)), *(body[i : i + 1] for i in range(len(body)))]
    answer = exchange(daemon.port, parts, pause=0.1, timeout=30)
    assert not answer.hung
    assert answer.status == 408, answer


def test_a_chunk_announcing_2_to_the_80_bytes_is_answered(slow_api: tuple[Daemon, str]) -> None:
    """A chunked body announcing a 2**80-byte chunk (that never comes) gets a 4xx answer or a
    close within the body timeout, not silence."""
    daemon, _ = slow_api
    head = _job_head(None, **{"Transfer-Encoding": "chunked"})
    for size in (2**80, 2**60):
        answer = exchange(daemon.port, [head + f"{size:x}\r\n".encode() + b"{"], timeout=20)
        assert not answer.hung, f"no answer to a {size:x}-byte chunk"
        assert answer.status is None or 400 <= answer.status < 500, answer


def test_content_length_and_chunked_together_are_refused(slow_api: tuple[Daemon, str]) -> None:
    """A request framed both ways (the request-smuggling shape) answers 400 naming it, and
    nothing is enqueued."""
    daemon, url = slow_api
    before = _count(url)
    body = b'{"data": {}}'
    head = _job_head(len(body), **{"Transfer-Encoding": "chunked"})
    answer = exchange(daemon.port, [head + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"])
    assert answer.status == 400, answer
    assert "Transfer-Encoding" in answer.json()["error"]
    assert _count(url) == before


def test_slow_clients_do_not_stall_good_ones(slow_api: tuple[Daemon, str]) -> None:
    """With 40 slow connections open (silent, dribbling headers, stalled bodies), good requests
    are answered at once: each slow one ends in a 408 or a close."""
    daemon, url = slow_api
    head = _job_head(50)
    slow_parts = [
        [],
        [head[i : i + 1] for i in range(len(head))],
        [head + b'{"data"'],
    ]
    with ThreadPoolExecutor(max_workers=40) as pool:
        slow = [
            pool.submit(exchange, daemon.port, slow_parts[n % 3], pause=0.2, timeout=30)
            for n in range(39)
        ]
        time.sleep(0.5)
        good = []
        with httpx.Client(timeout=5) as client:
            for n in range(20):
                response = client.post(
                    daemon.url("/v1/jobs/reports"), json={"data": {"good": n}}, headers=AUTH
                )
                good.append(response.status_code)
        answers = [future.result() for future in slow]
    assert good == [202] * 20
    assert not [a for a in answers if a.hung], "a slow connection was never ended"
    assert {a.status for a in answers} <= {None, 408}
    assert _count(url, "good") == 20


def test_a_client_that_hangs_up_mid_body_logs_one_line(slow_api: tuple[Daemon, str]) -> None:
    """A client that disconnects halfway through its body leaves one log line, no traceback."""
    daemon, url = slow_api
    before = _count(url)
    logged = len(_disconnects(daemon))
    exchange(daemon.port, [_job_head(1000) + b'{"data": {"half": '], close_after_send=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(_disconnects(daemon)) == logged:
        time.sleep(0.1)
    time.sleep(0.5)
    assert len(_disconnects(daemon)) == logged + 1, daemon.logs()[-3000:]
    assert "Traceback" not in daemon.logs()
    assert "ClientDisconnect" not in daemon.logs()
    assert _count(url) == before


def _disconnects(daemon: Daemon) -> list[dict[str, object]]:
    return [e for e in daemon.events() if e.get("event") == "http.client_disconnected"]


def _count(url: str, marker: str | None = None) -> int:
    async def count() -> int:
        conn = await asyncpg.connect(url)
        try:
            if marker is None:
                return int(await conn.fetchval("SELECT count(*) FROM jobs.job"))
            return int(await conn.fetchval("SELECT count(*) FROM jobs.job WHERE data ? $1", marker))
        finally:
            await conn.close()

    return asyncio.run(count())
