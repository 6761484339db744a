"""Real servers a drill starts for itself: PgBouncer in transaction mode in front of the test
server, and a PostgreSQL primary with a streaming standby (issue 13, drills 20 and 21).

Both refuse to run as root (PgBouncer, initdb), so under root they run as the ``postgres``
user, in a scratch directory that user owns. Every process started here is stopped by its own
pid (the ``Popen`` handle, or the postmaster's pid file), never by name.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from tests.support.processes import free_port
from tests.support.tools import unavailable

#: The user the servers run as when the tests run as root.
SERVER_USER = "postgres"


def _run_as() -> dict[str, Any]:
    """``subprocess`` arguments that drop root to SERVER_USER (nothing when not root)."""
    if os.geteuid() != 0:
        return {}
    try:
        entry = pwd.getpwnam(SERVER_USER)
    except KeyError:
        unavailable(f"running as root, and there is no {SERVER_USER!r} user to run servers as")
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A fresh directory the server user owns (pytest's tmp_path is root's and 0700)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        if os.geteuid() == 0:
            entry = pwd.getpwnam(SERVER_USER)
            os.chown(path, entry.pw_uid, entry.pw_gid)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _wait_port(port: int, timeout: float, what: str, process: subprocess.Popen[Any] | None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout:.0f}s")


# --- PgBouncer -------------------------------------------------------------------------------


@dataclass
class PgBouncer:
    """PgBouncer on a loopback port in transaction mode, passing every database through to
    ``server_port`` on 127.0.0.1 (trust auth, as the test server has)."""

    binary: str
    directory: Path
    server_port: int = 5432
    pool_size: int = 10
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def url(self, database: str, user: str = "postgres") -> str:
        """A URL through PgBouncer to ``database``."""
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    @property
    def log_path(self) -> Path:
        """PgBouncer's own log."""
        return self.directory / "pgbouncer.log"

    def start(self) -> PgBouncer:
        """Write the ini and the userlist, start it, wait until it listens."""
        (self.directory / "userlist.txt").write_text('"postgres" ""\n')
        (self.directory / "pgbouncer.ini").write_text(
            f"""[databases]
* = host=127.0.0.1 port={self.server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.directory}/userlist.txt
pool_mode = transaction
max_client_conn = 2000
default_pool_size = {self.pool_size}
reserve_pool_size = 0
server_reset_query =
ignore_startup_parameters = extra_float_digits,default_transaction_read_only
logfile = {self.log_path}
log_connections = 0
log_disconnections = 0
"""
        )
        run_as = _run_as()
        if run_as:
            for name in ("userlist.txt", "pgbouncer.ini"):
                os.chown(self.directory / name, run_as["user"], run_as["group"])
        self.process = subprocess.Popen(
            [self.binary, str(self.directory / "pgbouncer.ini")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            **run_as,
        )
        _wait_port(self.port, 15, "pgbouncer", self.process)
        return self

    def stop(self) -> None:
        """Stop it (SIGTERM, then SIGKILL) by its own pid."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def version(self) -> str:
        """``PgBouncer 1.18.0`` (the first line of ``--version``)."""
        done = subprocess.run(
            [self.binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
        return (done.stdout or done.stderr).strip().splitlines()[0] if done.stdout else "PgBouncer"

    def log(self) -> str:
        """What PgBouncer logged."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextlib.contextmanager
def running_pgbouncer(binary: str, prefix: str) -> Iterator[PgBouncer]:
    """PgBouncer (``binary``) started in a fresh scratch directory, stopped on the way out."""
    with scratch_dir(prefix) as directory:
        server = PgBouncer(binary, directory).start()
        try:
            yield server
        finally:
            server.stop()


# --- A primary and a streaming standby ------------------------------------------------------


def postgres_bin() -> Path:
    """The newest /usr/lib/postgresql/N/bin with initdb; missing, skip (fail under CI)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    if not found:
        unavailable(
            "the PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup) are not installed:"
            " `apt-get install postgresql` (Debian/Ubuntu)"
        )
    return Path(found[-1]).parent


#: The settings of every PostgreSQL server the harness starts: loopback only, no socket file,
#: small, commits waiting for the disk, no autovacuum (a test vacuums what it needs).
LOOPBACK_CONF = """
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
port = {port}
max_connections = 80
shared_buffers = 32MB
synchronous_commit = on
autovacuum = off
log_min_messages = warning
"""


@dataclass
class Node:
    """One PostgreSQL server of the pair."""

    bin: Path
    data: Path
    port: int = field(default_factory=free_port)

    def url(self, database: str = "postgres") -> str:
        """A URL to this server alone."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def run(self, tool: str, *args: str, timeout: float = 120) -> str:
        """Run one of the server's tools as the server user; its output."""
        done = subprocess.run(
            [str(self.bin / tool), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            **_run_as(),
        )
        if done.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)} failed: {done.stdout}{done.stderr}")
        return done.stdout

    def initdb(self, conf: str = "") -> None:
        """A new cluster (trust, superuser postgres) on this node's loopback port, with the
        settings every harness server shares (:data:`LOOPBACK_CONF`) and then ``conf``."""
        self.run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-N")
        with (self.data / "postgresql.conf").open("a") as settings:
            settings.write(LOOPBACK_CONF.format(port=self.port) + conf)

    def start(self) -> None:
        """pg_ctl start, waiting until it accepts connections."""
        self.run("pg_ctl", "-D", str(self.data), "-l", str(self.data / "server.log"), "-w",
                 "-t", "60", "start")  # fmt: skip

    def start_after_kill(self, timeout: float = 30) -> None:
        """Start it again once the killed server's processes are gone (until then its shared
        memory is still attached, and pg_ctl refuses: "another server might be running")."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.start()
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    async def create_database(self, name: str) -> str:
        """Create database ``name`` on this server; its URL."""
        admin = await asyncpg.connect(self.url())
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        return self.url(name)

    def postmaster_pid(self) -> int | None:
        """The postmaster's pid from its pid file, if that process is this server's postmaster
        still (a pid file outlives a killed server, and its pid may be reused)."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().splitlines()[0])
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            return None
        return pid if str(self.data).encode() in command else None

    def kill(self) -> None:
        """SIGKILL the postmaster and every process of this server at one instant, as when its
        host dies: frozen first (SIGSTOP), so no backend or WAL sender does anything more
        after the postmaster is gone (alone, the WAL sender would stream what it has left)."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        children = _children(pid)
        for each in (*children, pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGSTOP)
        for each in (pid, *children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGKILL)

    def promote(self) -> None:
        """pg_ctl promote, waiting until it is done."""
        self.run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "promote")

    def stop(self) -> None:
        """Stop it at once if it runs (pg_ctl by its pid file); then whatever is left of it."""
        if self.postmaster_pid() is None:
            return
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self.run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "30", "stop")
        self.kill()

    def log(self) -> str:
        """The server's log."""
        path = self.data / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == str(pid):
            found.append(int(stat.parent.name))
    return found


#: A streaming primary's settings (the standby copies them), on top of LOOPBACK_CONF.
_REPLICATION_CONF = """
wal_level = replica
max_wal_senders = 5
hot_standby = on
wal_keep_size = 256MB
"""


@dataclass
class ReplicatedPair:
    """A primary and a standby streamed from it by ``pg_basebackup -R``; ``synchronous`` sets
    ``synchronous_standby_names`` on the primary after the base backup (set before, the
    promoted standby would inherit it and wait on every commit for a standby it lacks)."""

    bin: Path
    directory: Path
    synchronous: bool = True
    primary: Node = field(init=False)
    standby: Node = field(init=False)

    def __post_init__(self) -> None:
        self.primary = Node(self.bin, self.directory / "primary")
        self.standby = Node(self.bin, self.directory / "standby")

    def url(self, database: str) -> str:
        """The two-host URL the daemons use: whichever server is writable."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
            f"/{database}?target_session_attrs=read-write"
        )

    def start(self) -> ReplicatedPair:
        """initdb, start the primary, base-backup the standby, start it, then (synchronous)
        make it the synchronous standby and wait until the primary says so."""
        p = self.primary
        p.initdb(_REPLICATION_CONF)
        p.start()
        s = self.standby
        p.run("pg_basebackup", "-h", "127.0.0.1", "-p", str(p.port), "-U", "postgres",
              "-D", str(s.data), "-R", "-X", "stream", "-c", "fast")  # fmt: skip
        with (s.data / "postgresql.conf").open("a") as conf:
            conf.write(f"port = {s.port}\n")
        s.start()
        if self.synchronous:
            p.run("psql", "-h", "127.0.0.1", "-p", str(p.port), "-U", "postgres", "-qAt", "-c",
                  "ALTER SYSTEM SET synchronous_standby_names = '*'")  # fmt: skip
            p.run("psql", "-h", "127.0.0.1", "-p", str(p.port), "-U", "postgres", "-qAt", "-c",
                  "SELECT pg_reload_conf()")  # fmt: skip
        want = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + 60
        while True:
            state = p.run("psql", "-h", "127.0.0.1", "-p", str(p.port), "-U", "postgres", "-qAt",
                          "-c", "SELECT sync_state FROM pg_stat_replication")  # fmt: skip
            if state.strip() == want:
                return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"standby not {want} after 60s: {state!r}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop both servers."""
        self.standby.stop()
        self.primary.stop()
