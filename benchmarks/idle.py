"""Idle cost: what a worker with 7 queues and nothing to do costs the database over 30 s."""

from __future__ import annotations

import time
from dataclasses import dataclass

import anyio
import asyncpg

from .common import admin_url, install_queues, scratch_database, start_worker
from .noop import IDLE

WINDOW = 30.0
#: After /readyz, let boot traffic end and its statistics flush (a backend that went idle less
#: than 1 s after its last flush reports up to 10 s later: PGSTAT_IDLE_INTERVAL), and let the
#: background writer log its running-transactions record for the set-up's own WAL before the
#: window opens, not inside it: it logs one at most every 15 s (LOG_SNAPSHOT_INTERVAL_MS) and,
#: hibernating when idle, may take 10 s more to look (pg_waldump showed the 56-byte Standby
#: RUNNING_XACTS record, transaction 0, landing 17 s after the set-up's VACUUM).
SETTLE = 30.0

_STATS = """
SELECT datname, xact_commit, tup_inserted + tup_updated + tup_deleted AS writes
FROM pg_stat_database WHERE datname IS NOT NULL
"""


@dataclass(frozen=True, slots=True)
class IdleResult:
    """Commits in the worker's database, WAL bytes of the cluster, and whether anyone else
    wrote meanwhile (then the WAL figure is not the worker's alone)."""

    commits: int
    wal_bytes: int
    own_writes: int
    others_wrote: bool
    #: WAL the server wrote on its own over an equal window with no worker running (its
    #: periodic running-transactions record): subtracted to give the worker's share.
    baseline_wal_bytes: int = 0

    @property
    def worker_wal_bytes(self) -> int:
        """WAL attributable to the worker: the window's, less the server's own baseline."""
        return max(0, self.wal_bytes - self.baseline_wal_bytes)


async def _snapshot(admin: asyncpg.Connection) -> tuple[dict[str, tuple[int, int]], int]:
    await admin.execute("SELECT pg_stat_clear_snapshot()")
    rows = await admin.fetch(_STATS)
    lsn = await admin.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    return {r["datname"]: (r["xact_commit"], r["writes"]) for r in rows}, int(lsn)


async def idle_cost() -> IdleResult:
    """Start a worker (POLL_INTERVAL_SECONDS at its default), let it settle, count 30 s.

    The database is vacuumed and analysed first, so autovacuum (whose transactions would count
    as commits of this database) has nothing to do during the window.

    The counters are read from the ``postgres`` database, so the measurement commits nothing in
    the worker's database; its own commits elsewhere are excluded by leaving ``postgres`` out of
    the "others wrote" check's commit side (only tuple writes count there).
    """
    async with scratch_database("idle") as url:
        await install_queues(url, IDLE)
        name = url.rsplit("/", 1)[1]
        daemon = start_worker(url, "benchmarks.noop:IDLE")
        try:
            await anyio.to_thread.run_sync(daemon.wait_ready, 60.0)
            # A fresh database invites autovacuum (the install wrote rows and catalogs), whose
            # transactions count in xact_commit too: leave it nothing to do in the window.
            # ANALYZE first, then VACUUM, which also clears the pg_statistic rows ANALYZE wrote.
            conn = await asyncpg.connect(url)
            try:
                await conn.execute("ANALYZE")
                await conn.execute("VACUUM")
            finally:
                await conn.close()
            await anyio.sleep(SETTLE)
            admin = await asyncpg.connect(admin_url())
            try:
                before, lsn_before = await _snapshot(admin)
                started = time.monotonic()
                await anyio.sleep(WINDOW)
                after, lsn_after = await _snapshot(admin)
                assert abs(time.monotonic() - started - WINDOW) < 1.0
            finally:
                await admin.close()
        finally:
            daemon.stop()
        # The same window with no worker at all: what the server writes on its own.
        admin = await asyncpg.connect(admin_url())
        try:
            base_before, base_lsn_before = await _snapshot(admin)
            await anyio.sleep(WINDOW)
            base_after, base_lsn_after = await _snapshot(admin)
        finally:
            await admin.close()
        base_others = any(
            base_after[db][1] - base_before.get(db, (0, 0))[1] > 0 for db in base_after
        )
    commits = after[name][0] - before[name][0]
    own_writes = after[name][1] - before[name][1]
    others = any(after[db][1] - before.get(db, (0, 0))[1] > 0 for db in after if db != name) or set(
        after
    ) != set(before)
    baseline = base_lsn_after - base_lsn_before
    return IdleResult(commits, lsn_after - lsn_before, own_writes, others or base_others, baseline)
