"""The one process harness of the tests and the benchmarks (tests/support/processes.py)."""

from __future__ import annotations

import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

import benchmarks.common
from tests.support import processes
from tests.support.processes import Daemon, free_port

#: A stand-in daemon: answers 200 on every GET at the port given as its argument.
READY_SERVER = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class Ready(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"ready": true}')

    def log_message(self, *args):
        pass

HTTPServer(("127.0.0.1", int(sys.argv[1])), Ready).serve_forever()
"""


class _Ready(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"ready": true}')

    def log_message(self, *args: object) -> None:
        pass


def test_wait_ready_ignores_another_process_answering_on_its_port(tmp_path: Path) -> None:
    """A process that never bound its port is not ready, even though something else answers
    200 on /readyz there (what two daemons handed one port looked like)."""
    other = HTTPServer(("127.0.0.1", 0), _Ready)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        daemon = Daemon(silent, other.server_address[1], tmp_path / "silent.log", {})
        with pytest.raises(AssertionError, match="not ready"):
            daemon.wait_ready(timeout=1.5)
    finally:
        silent.kill()
        silent.wait()
        other.shutdown()


def test_wait_ready_accepts_the_process_that_listens(tmp_path: Path) -> None:
    """A process that listens on its own port and answers 200 is ready, whatever it logs."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", READY_SERVER, str(port)])
    try:
        Daemon(server, port, tmp_path / "server.log", {}).wait_ready(timeout=30)
        assert port in processes.listening_ports(server.pid)
    finally:
        server.kill()
        server.wait()


def test_free_port_never_hands_out_one_port_twice() -> None:
    """Ports handed out in one process are all distinct, even as each probe socket closes."""
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)


def test_benchmarks_use_the_same_harness() -> None:
    """The benchmarks start their workers through this harness, not a copy of it."""
    assert benchmarks.common.Daemon is Daemon
    assert not hasattr(benchmarks.common, "free_port")
    assert benchmarks.common.start_daemon is processes.start_daemon
