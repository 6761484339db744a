"""Running the real ``chassis-worker`` CLI in subprocesses, as an operator would.

The one process harness of the tests and the benchmarks (``benchmarks/common.py`` starts its
workers through :func:`start_daemon` with ``fast=False``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

#: Short timings so faults play out in seconds (RELIABILITY.md: heartbeat 1 s, stale 5 s, ...).
FAST_TIMINGS = {
    "POLL_INTERVAL_SECONDS": "0.5",
    "HEARTBEAT_SECONDS": "1",
    "WORKER_STALE_SECONDS": "5",
    "MAINTENANCE_INTERVAL_SECONDS": "2",
    "SHUTDOWN_GRACE_SECONDS": "5",
    "DATABASE_POOL_SIZE": "4",
    "LOG_FORMAT": "json",
    "LOG_LEVEL": "info",
}

#: A benchmark's daemon: the daemon's own default timings, and only warnings logged (with the
#: log downstream at info, every delivered batch would be written out and timed with it).
BENCH_SETTINGS = {"LOG_FORMAT": "json", "LOG_LEVEL": "warning"}

#: Settings a daemon started here never inherits from the caller's environment: it gets only
#: what the test or benchmark gives it.
_NOT_INHERITED = ("DATABASE_", "SERVICE_", "TOOL_", "POLL_", "LOG_")


#: Ports this process handed out: a port is free again the moment its probe socket closes, so
#: the kernel may offer it twice before the first daemon binds it (seen: two of ten daemons
#: started in one loop got the same port, and one daemon's /readyz answered for the other).
_handed_out: set[int] = set()


#: Ports handed out lie below the kernel's ephemeral range, in a block of their own per pytest-xdist
#: worker. A port the kernel picks for bind(0) is ephemeral: between the test's check and the
#: daemon's bind, any outgoing connection of any process (a PostgreSQL client, say) may take it
#: as its local port, and the daemon then fails with "address already in use" (seen under load).
#: Below that range only a listener can take a port, and the per-worker blocks keep parallel
#: workers from handing out the same one.
_PORT_BLOCK = 1000
_PORT_BASE = 20000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port_block() -> range:
    """This process's block: by xdist worker (gw0, gw1, ...), else by pid, below the ephemeral
    range (empty when the range starts too low to leave room)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    slots = max(0, (_ephemeral_low() - _PORT_BASE) // _PORT_BLOCK)
    if slots == 0:
        return range(0)
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else os.getpid()
    start = _PORT_BASE + (index % slots) * _PORT_BLOCK
    return range(start, start + _PORT_BLOCK)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port nothing listens on right now, not handed out before by this process, and out
    of the kernel's ephemeral range where it can (see :data:`_PORT_BLOCK`)."""
    block = _port_block()
    # From a random point of the block: two test runs at once on one machine (their gw0 share a
    # block) then rarely try the same port at the same moment.
    start = random.randrange(len(block)) if block else 0
    for port in (*block[start:], *block[:start]):
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            return port
    while True:  # no room below the ephemeral range, or the block is used up
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def base_env(database_url: str | None, *, fast: bool = True, **extra: str) -> dict[str, str]:
    """The environment of a daemon process: FAST_TIMINGS for a test (``fast``), else the
    defaults and BENCH_SETTINGS (a benchmark); nothing in _NOT_INHERITED from the caller.
    ``database_url`` ``None`` leaves DATABASE_URL unset, for the embedded server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_INHERITED)}
    env.update(FAST_TIMINGS if fast else BENCH_SETTINGS)
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


@dataclass
class Daemon:
    """One ``chassis-worker run`` process with its log file and HTTP port."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    env: dict[str, str] = field(repr=False)

    @property
    def pid(self) -> int:
        """The process id."""
        return self.process.pid

    def url(self, path: str) -> str:
        """An URL on this process's HTTP listener."""
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str, timeout: float = 2.0) -> tuple[int, Any]:
        """GET ``path``; (status, decoded JSON or text). Status 0 when nothing answers."""
        try:
            with urllib.request.urlopen(self.url(path), timeout=timeout) as response:
                body = response.read().decode()
                return response.status, _decode(body)
        except urllib.error.HTTPError as exc:
            return exc.code, _decode(exc.read().decode())
        except (urllib.error.URLError, OSError):
            return 0, None

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until /readyz answers 200; fail with the log if the process dies or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"daemon exited {self.process.returncode}:\n{self.logs()}")
            status, _ = self.get("/readyz", timeout=1.0)
            # Only this process's own listener counts (another may hold the port).
            if status == 200 and self._listening():
                return
            time.sleep(0.05)
        raise AssertionError(f"daemon not ready after {timeout}s:\n{self.logs()}")

    def _listening(self) -> bool:
        """Whether this process itself listens on ``port``: from /proc where there is one (any
        log level), else from its ``http.listening`` log line."""
        if _PROC_NET.exists():
            return self.port in listening_ports(self.pid)
        return any(
            e.get("event") == "http.listening" and e.get("port") == self.port for e in self.events()
        )

    def peak_rss_bytes(self) -> int:
        """VmHWM: the most resident memory the process has had so far (Linux)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM in /proc status")

    def logs(self) -> str:
        """Everything the process wrote so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def events(self) -> list[dict[str, Any]]:
        """The JSON log lines written so far."""
        out = []
        for line in self.logs().splitlines():
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                out.append(value)
        return out

    def signal(self, signum: signal.Signals) -> None:
        """Send ``signum`` to the process."""
        self.process.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL, and reap."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)

    def wait(self, timeout: float = 30.0) -> int:
        """Wait for exit and return the exit code."""
        return self.process.wait(timeout=timeout)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; SIGKILL if it does not exit in time."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return int(self.process.returncode)


def start_daemon(
    database_url: str | None,
    log_dir: Path,
    *,
    role: str = "worker",
    env: Mapping[str, str] | None = None,
    name: str = "daemon",
    fast: bool = True,
    python: str | None = None,
) -> Daemon:
    """Start ``python -m worker run`` (fast timings unless ``fast`` is false) with ``log_dir``
    as its working directory; returns at once (see ``wait_ready``). ``python``: another
    interpreter (a venv with other packages; the code is this tree's, through PYTHONPATH)."""
    port = free_port()
    settings = {"SERVICE_ROLE": role, **dict(env or {}), "HTTP_PORT": str(port)}
    full_env = base_env(database_url, fast=fast, **settings)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}-{port}.log"
    handle = log_path.open("wb")
    process = subprocess.Popen(
        [python or sys.executable, "-m", "worker", "run"],
        env=full_env,
        stdout=handle,
        stderr=subprocess.STDOUT,
        cwd=log_dir,
    )
    handle.close()
    return Daemon(process, port, log_path, full_env)


@contextmanager
def ready_daemon(
    database_url: str | None, log_dir: Path, *, timeout: float = 60.0, **options: Any
) -> Iterator[Daemon]:
    """:func:`start_daemon` with ``options``, waited ready (else the test fails with its log),
    and stopped (SIGTERM) when the block ends."""
    daemon = start_daemon(database_url, log_dir, **options)
    try:
        daemon.wait_ready(timeout)
        yield daemon
    finally:
        daemon.stop()


def run_cli(
    database_url: str | None,
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m worker ARGS`` to completion and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        env=base_env(database_url, **dict(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        check=False,
    )


def split_stderr(stderr: str) -> tuple[list[dict[str, Any]], list[str]]:
    """A CLI command's stderr as (its JSON log records, every other line): every command but
    run logs to stderr, so a one-line report is the one line that is not a log record."""
    records: list[dict[str, Any]] = []
    lines: list[str] = []
    for line in stderr.strip().splitlines():
        value = _decode(line)
        if isinstance(value, dict) and "event" in value:
            records.append(value)
        else:
            lines.append(line)
    return records, lines


_PROC_NET = Path("/proc/self/net/tcp")


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` holds a listening socket on (Linux /proc)."""
    fd_dir = Path(f"/proc/{pid}/fd")
    sockets = set()
    try:
        for fd in fd_dir.iterdir():
            try:
                sockets.add(os.readlink(fd))
            except OSError:  # closed meanwhile
                continue
    except OSError:  # the process is gone
        return set()
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and f"socket:[{inode}]" in sockets:  # 0A: LISTEN
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def _decode(body: str) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return body
