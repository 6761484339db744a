"""A worker process's own listener (worker.http.probe_server): the probes without an ASGI stack,
with the same deadlines and refusals as the api's."""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from tests.support.postgres import create_database, drop_database, with_database
from tests.support.processes import ROOT, Daemon, start_daemon
from tests.support.rawhttp import exchange, request_head

pytestmark = [pytest.mark.slow]

HEADER_TIMEOUT = 1.0


def test_a_worker_process_never_loads_starlette_or_uvicorn() -> None:
    """The worker role's listener comes without them (about 3.8 MB of the process); the api
    role's is still Starlette on uvicorn."""
    probe = (
        "import sys\n"
        "from worker.boot import http_server\n"
        "from worker.settings import Settings\n"
        "from worker.state import ServiceState\n"
        "role = sys.argv[1]\n"
        "settings = Settings(_env_file=None, service_role=role, http_port=0)\n"
        "http_server(settings, ServiceState(settings))\n"
        "tops = {m.split('.')[0] for m in sys.modules}\n"
        "print(sorted(tops & {'starlette', 'uvicorn', 'click'}))\n"
    )
    seen = {}
    for role in ("worker", "api"):
        done = subprocess.run(
            [sys.executable, "-c", probe, role],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
        )
        seen[role] = done.stdout.strip()
    assert seen == {"worker": "[]", "api": "['click', 'starlette', 'uvicorn']"}


def test_run_loads_no_other_command_and_no_usage_event_schema() -> None:
    """``run`` imports only the daemon's command module, and a worker never validates a usage
    event, so none of it is built; ``jobs`` still loads its own module, and the ingest (api
    and all roles) builds the schema when it is imported, not in its first request."""
    probe = (
        "import sys\n"
        "from api_sender import UsageEvent\n"
        "from worker.cli import _command\n"
        "from worker.commands.arguments import build_parser\n"
        "_command(build_parser().parse_args(sys.argv[1:]))\n"
        "print(sorted(m for m in sys.modules if m.startswith('worker.commands.')))\n"
        "print(UsageEvent.__pydantic_complete__)\n"
        "import worker.http.ingest\n"
        "print(UsageEvent.__pydantic_complete__)\n"
    )

    def loaded(*argv: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", probe, *argv], capture_output=True, text=True, cwd=ROOT
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split("\n")[:3]

    assert loaded("run") == [
        "['worker.commands.arguments', 'worker.commands.daemon', 'worker.commands.failures',"
        " 'worker.commands.output']",
        "False",
        "True",
    ]
    jobs = loaded("jobs", "list")[0]
    assert "'worker.commands.jobs'" in jobs
    assert "'worker.commands.daemon'" not in jobs


@pytest.fixture(scope="module")
def worker(admin_url: str, template_name: str, tmp_path_factory) -> Iterator[Daemon]:
    """A worker with a 1 s header timeout, on a database of its own."""
    name = asyncio.run(create_database(admin_url, template_name))
    daemon = start_daemon(
        with_database(admin_url, name),
        tmp_path_factory.mktemp("worker-http"),
        env={"HTTP_HEADER_TIMEOUT_SECONDS": str(HEADER_TIMEOUT)},
    )
    try:
        daemon.wait_ready(60)
        yield daemon
    finally:
        daemon.stop()
        asyncio.run(drop_database(admin_url, name))


@pytest.mark.parametrize(
    ("method", "path", "status", "body"),
    [
        ("GET", "/healthz", 200, b'{"ok":true}'),
        ("GET", "/readyz?probe=1", 200, b'{"ready":true}'),
        ("HEAD", "/healthz", 200, b""),
        ("POST", "/healthz", 405, b"Method Not Allowed"),
        ("DELETE", "/metrics", 405, b"Method Not Allowed"),
        ("GET", "/v1/usage-events", 404, b'{"error":"not found: this is a worker process"}'),
        ("POST", "/v1/jobs/reports", 404, b'{"error":"not found: this is a worker process"}'),
        ("GET", "/console/", 404, b"Not Found"),
    ],
)
def test_routes(worker: Daemon, method: str, path: str, status: int, body: bytes) -> None:
    """Each answer closes its connection; a HEAD has the GET's headers and no body."""
    answer = exchange(worker.port, [request_head(method, path)], timeout=10)
    assert (answer.status, answer.body) == (status, body), answer
    assert answer.headers["connection"] == "close"
    assert answer.closed
    if status == 405:
        assert answer.headers["allow"] == "GET, HEAD"


def test_metrics_head_announces_the_gets_length(worker: Daemon) -> None:
    answer = exchange(worker.port, [request_head("HEAD", "/metrics")], timeout=10)
    assert answer.status == 200
    assert answer.body == b""
    assert answer.headers["content-type"].startswith("text/plain; version=")
    assert int(answer.headers["content-length"]) > 1000


def test_a_silent_connection_is_closed(worker: Daemon) -> None:
    answer = exchange(worker.port, [], timeout=HEADER_TIMEOUT + 10)
    assert not answer.hung, "the worker kept a silent connection open"
    assert answer.closed
    assert answer.status is None


def test_a_head_sent_byte_by_byte_gets_408(worker: Daemon) -> None:
    head = request_head("GET", "/metrics", {"X-Padding": "p" * 40})
    answer = exchange(worker.port, [head[i : i + 1] for i in range(len(head))], pause=0.05)
    assert not answer.hung, "the worker waited on a slow head"
    assert answer.status == 408, answer
    assert answer.json()["errors"][0]["field"] == "(headers)"
    assert answer.closed


def test_an_oversized_head_gets_431(worker: Daemon) -> None:
    answer = exchange(worker.port, [request_head("GET", "/healthz", {"X-Big": "b" * 20_000})])
    assert answer.status == 431, answer
    assert answer.closed


@pytest.mark.parametrize(
    "line", [b"GARBAGE", b"GET /healthz", b"GET /healthz SPDY/3", b"GET  HTTP/1.1"]
)
def test_a_malformed_request_line_gets_400(worker: Daemon, line: bytes) -> None:
    answer = exchange(worker.port, [line + b"\r\n\r\n"], timeout=10)
    assert answer.status == 400, answer
    assert answer.closed


def test_slow_clients_do_not_stall_good_ones(worker: Daemon) -> None:
    """While ten connections dribble their heads, /healthz answers at once, every time."""
    slow = [
        threading.Thread(
            target=exchange,
            args=(worker.port, [b"G", b"E", b"T", b" ", b"/"]),
            kwargs={"pause": 0.3, "timeout": 10},
        )
        for _ in range(10)
    ]
    for thread in slow:
        thread.start()
    try:
        for _ in range(5):
            answer = exchange(worker.port, [request_head("GET", "/healthz")], timeout=5)
            assert answer.status == 200
            assert not answer.hung
    finally:
        for thread in slow:
            thread.join()


def _open_descriptors(pid: int) -> int:
    """How many file descriptors process ``pid`` has open now."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def _idle_connections(port: int, n: int) -> list[socket.socket]:
    """``n`` TCP connections to ``port`` that never send a byte."""
    return [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(n)]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs Linux's /proc")
@pytest.mark.parametrize(("spare", "idle"), [(None, 300), (8, 40)])
async def test_idle_connections_past_the_descriptor_limit_never_end_the_worker(
    db_url: str, tmp_path, spare: int | None, idle: int
) -> None:
    """With its descriptor limit at 256 and 300 idle connections (the old listener let
    accept()'s EMFILE end the process), or with only 8 descriptors to spare and 40 of them, the
    worker stays up: idle probe connections are capped, a failed accept() is logged once and
    retried, and /healthz answers once the idle ones are gone."""
    daemon = start_daemon(db_url, tmp_path, env={"HTTP_HEADER_TIMEOUT_SECONDS": "2"})
    sockets: list[socket.socket] = []
    try:
        await asyncio.to_thread(daemon.wait_ready, 60)
        limit = 256 if spare is None else _open_descriptors(daemon.pid) + spare
        resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE, (limit, limit))
        sockets = await asyncio.to_thread(_idle_connections, daemon.port, idle)
        await asyncio.sleep(1.0)
        assert daemon.process.poll() is None, daemon.logs()
        if spare is None:
            # Under the cap, a probe still gets through while the idle ones wait.
            answer = await asyncio.to_thread(
                exchange, daemon.port, [request_head("GET", "/healthz")], timeout=5
            )
            assert answer.status == 200
        for s in sockets:
            s.close()
        sockets = []
        status = 0
        for _ in range(100):
            status, _ = await asyncio.to_thread(daemon.get, "/healthz")
            if status == 200:
                break
            await asyncio.sleep(0.1)
        assert status == 200
        assert daemon.process.poll() is None, daemon.logs()
        events = [e["event"] for e in daemon.events()]
        if spare is not None:
            assert events.count("http.accept_failed") == 1, daemon.logs()
            assert "http.accept_recovered" in events
    finally:
        for s in sockets:
            s.close()
        daemon.kill()
