"""A stop during boot ends the process at once, whatever boot was waiting for (exit 0)."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import asyncpg
import fasteners
import pytest

from tests.support.embedded import stop_embedded
from tests.support.processes import Daemon, free_port, start_daemon

#: How long a stop during boot may take: "at once", with room for a loaded machine.
STOP_WITHIN = 5.0


def _wait_for(daemon: Daemon, *events: str, timeout: float = 30.0) -> None:
    """Block until the daemon logged one of ``events``; fail if it exits first or never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e.get("event") in events for e in daemon.events()):
            return
        if daemon.process.poll() is not None:
            raise AssertionError(f"exited {daemon.process.returncode} first:\n{daemon.logs()}")
        time.sleep(0.05)
    raise AssertionError(f"none of {events} within {timeout}s:\n{daemon.logs()}")


def _stop_and_time(daemon: Daemon) -> tuple[int | None, float]:
    started = time.monotonic()
    daemon.signal(signal.SIGTERM)
    try:
        code: int | None = daemon.wait(timeout=STOP_WITHIN)
    except Exception:
        code = None
    return code, time.monotonic() - started


@pytest.mark.slow
@pytest.mark.parametrize("role", ["worker", "api"])
def test_sigterm_while_the_database_is_unreachable_exits_0_at_once(
    tmp_path: Path, role: str
) -> None:
    """DATABASE_URL on a closed port: after the first retry is logged, SIGTERM ends run (exit 0)."""
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/chassis"
    daemon = start_daemon(url, tmp_path, role=role)
    try:
        # The first retry line of whichever loop waits (the install's connect, the pool's).
        _wait_for(daemon, "db.connect_retry", "install.retry", "db.unreachable")
        code, took = _stop_and_time(daemon)
        assert code == 0, f"exit {code} after {took:.1f}s:\n{daemon.logs()}"
    finally:
        daemon.kill()


@pytest.mark.slow
async def test_sigterm_while_waiting_for_the_install_lock_exits_0_at_once(
    db_url: str, tmp_path: Path
) -> None:
    """Another process holds the install lock: SIGTERM ends the waiting worker at once (exit 0)."""
    holder = await asyncpg.connect(db_url)
    try:
        await holder.execute(
            "SELECT pg_advisory_lock(hashtextextended('chassis-worker:' || $1 || ':' || $2, 0))",
            "install",
            "jobs",
        )
        daemon = start_daemon(db_url, tmp_path, role="worker")
        try:
            await asyncio.to_thread(_wait_for, daemon, "lock.waiting")
            code, took = await asyncio.to_thread(_stop_and_time, daemon)
            assert code == 0, f"exit {code} after {took:.1f}s:\n{daemon.logs()}"
        finally:
            daemon.kill()
    finally:
        await holder.close()


@pytest.mark.slow
@pytest.mark.xdist_group("embedded")
def test_sigterm_while_waiting_for_the_embedded_server_exits_0_at_once(tmp_path: Path) -> None:
    """DATABASE_URL unset and another process setting up the embedded server (holding its
    lock): SIGTERM ends the waiting run at once (exit 0), before any set-up of its own."""
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    data = tmp_path / "pg"
    # The embedded package's inter-process lock, under XDG_RUNTIME_DIR (platformdirs).
    lock = fasteners.InterProcessLock(str(runtime / "python_PostgresServer" / ".lockfile"))
    assert lock.acquire(blocking=False)
    try:
        env = {"EMBEDDED_DATA_DIR": str(data), "XDG_RUNTIME_DIR": str(runtime)}
        daemon = start_daemon(None, tmp_path, role="worker", env=env)
        try:
            _wait_for(daemon, "db.embedded_starting")
            code, took = _stop_and_time(daemon)
            assert code == 0, f"exit {code} after {took:.1f}s:\n{daemon.logs()}"
            assert not (data / "PG_VERSION").exists()
        finally:
            daemon.kill()
    finally:
        lock.release()
        stop_embedded(data)
