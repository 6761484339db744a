"""CPU time of the worker process and of the database server, for the per-job cost rows.

Read from ``/proc``: a process's own user and system time, and for the server every process of
it (the postmaster and its children). A backend that exits is reaped by the postmaster, which
then carries its time in its children's fields, so a server's total counts the connections
that closed during the window too (pgbench's, the benchmark's own).
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import asyncpg

_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (which may hold spaces)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def _seconds(fields: list[str], *, children: bool) -> float:
    # After the name: state, ppid, ... utime (index 11), stime, cutime, cstime.
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _TICKS


def process_seconds(pid: int) -> float:
    """User plus system CPU seconds of one live process."""
    fields = _stat(pid)
    if fields is None:
        raise ProcessLookupError(pid)
    return _seconds(fields, children=False)


def server_seconds(postmaster: int) -> float:
    """CPU seconds of every process of the server whose postmaster is ``postmaster``."""
    own = _stat(postmaster)
    if own is None:
        raise ProcessLookupError(postmaster)
    total = _seconds(own, children=True)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields is not None and int(fields[1]) == postmaster:
            total += _seconds(fields, children=True)
    return total


async def postmaster_of(url: str) -> int | None:
    """The server's postmaster pid when it runs on this machine and ``/proc`` shows it (the
    parent of this connection's backend), else ``None``."""
    conn = await asyncpg.connect(url)
    try:
        backend = await conn.fetchval("SELECT pg_backend_pid()")
        fields = _stat(backend)  # read while the backend lives
        local = fields is not None and _comm(backend) == "postgres"
    finally:
        await conn.close()
    if not local or fields is None:
        return None
    parent = int(fields[1])
    return parent if _stat(parent) is not None else None


async def quiesced(url: str, timeout: float = 30.0) -> None:
    """Return once no backend of ``url``'s database is left, its own included, and each has
    been reaped: only then is a closed connection's time in the postmaster's children's fields
    (read earlier, a backend reaped between the postmaster and the walk of its children would
    be in neither)."""
    with anyio.fail_after(timeout):
        conn = await asyncpg.connect(url)
        try:
            mine = await conn.fetchval("SELECT pg_backend_pid()")
            others = (
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            while await conn.fetchval(others):
                await anyio.sleep(0.01)
        finally:
            await conn.close()
        while Path(f"/proc/{mine}").exists():  # a zombie keeps its entry until reaped
            await anyio.sleep(0.01)


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
