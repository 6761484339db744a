"""The CPU rows of ``make bench`` read the server's time from /proc: every process of it,
including a connection that closed in the window (its time moves to the postmaster's reaped
children), which is how the ceiling's pgbench clients and the benchmark's own are counted."""

from __future__ import annotations

from pathlib import Path

import anyio
import asyncpg

from benchmarks import cpu

#: A statement that keeps one backend on the CPU for a while (about 0.5 s here).
_BUSY = "SELECT sum(g) FROM generate_series(1, 3000000) g"


async def test_the_server_total_counts_a_backend_that_has_exited(admin_url: str) -> None:
    postmaster = await cpu.postmaster_of(admin_url)
    assert postmaster is not None, "the test server runs on this machine"
    before = cpu.server_seconds(postmaster)
    conn = await asyncpg.connect(admin_url)
    backend = await conn.fetchval("SELECT pg_backend_pid()")
    own = cpu.process_seconds(backend)
    await conn.fetchval(_BUSY)
    spent = cpu.process_seconds(backend) - own
    await conn.close()
    with anyio.fail_after(10):  # until the postmaster has reaped it
        while Path(f"/proc/{backend}").exists():
            await anyio.sleep(0.02)
    after = cpu.server_seconds(postmaster)
    assert spent > 0.05
    # The backend's time is still in the total once it is gone (a tick of rounding aside).
    assert after - before >= spent - 0.02
