"""Drill: the server crashes right after a completion committed without waiting for the disk.

Completions commit with synchronous_commit off and the worker keeps each batch until it has
seen the WAL flushed past it (worker.queue.unflushed). A server of the drill's own (initdb on a
loopback port) runs with ``wal_writer_delay = 10s``, so a lone completion stays in the WAL
buffers; every process of that server is SIGKILLed the moment the job shows completed, and the
server started again. Its recovery undoes the completion: the job is active again under the
worker, which lives on. The worker must write it again within seconds of the server's return:
every job completed, none run twice, and the log says a completion was restored. Without the
worker's record of unflushed completions the job would stay active until its expiry.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from api_sender import Sender
from tests.drills.helpers import (
    Fleet,
    create_ledger,
    fetch,
    log_events,
    runs,
    wait_for,
)
from tests.support.servers import Node, postgres_bin, scratch_dir

pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills")]

QUEUE = "drill-work"
DATABASE = "chassis"
#: The job undone by the crash must be completed again this soon after the server is back.
BACK_WITHIN = 15.0

#: The WAL writer flushes lazily committed WAL this late (its maximum), so the crash finds the
#: lone completion still in the WAL buffers.
_LATE_WAL_WRITER = "wal_writer_delay = 10s\n"

STATE = "SELECT state::text FROM jobs.job WHERE id = $1"


async def test_a_completion_the_crash_undid_is_written_again(fleet: Fleet, drill_report):
    """SIGKILL of every server process just after a lazily committed completion: after the
    restart the worker completes the undone job again; nothing runs twice, nothing waits."""
    with scratch_dir("chassis-crash-") as directory:
        node = Node(postgres_bin(), directory / "data")
        node.initdb(_LATE_WAL_WRITER)
        node.start()
        try:
            url = await node.create_database(DATABASE)
            await create_ledger(url)
            # A heartbeat would flush the WAL (its commit waits for the disk): keep it away
            # from the instant of the crash.
            [worker] = await fleet.start_ready(
                url, {"HEARTBEAT_SECONDS": "30", "WORKER_STALE_SECONDS": "60"}
            )
            async with Sender.connect(url, max_size=1) as sender:
                first = await sender.send_many(QUEUE, [{"n": n} for n in range(20)])

                async def first_done() -> bool:
                    rows = await fetch(
                        url,
                        "SELECT count(*) AS n FROM jobs.job WHERE id = ANY($1)"
                        " AND state = 'completed'",
                        first,
                    )
                    return int(rows[0]["n"]) == len(first)

                await wait_for(first_done, 30, "the first jobs to complete")
                # Let the WAL writer go quiet, then one lone job: its completion is the last
                # thing the server writes before the crash.
                await asyncio.sleep(0.5)
                lone = await sender.send(QUEUE, {"n": "lone"})
            assert lone is not None
            conn = await asyncpg.connect(url)
            try:
                deadline = time.monotonic() + 30
                while await conn.fetchval(STATE, lone) != "completed":
                    assert time.monotonic() < deadline, "the lone job never completed"
                    await asyncio.sleep(0.005)
            finally:
                conn.terminate()
            node.kill()
            killed = time.monotonic()
            await asyncio.to_thread(node.start_after_kill)
            back = time.monotonic()

            async def restored() -> bool:
                rows = await fetch(url, STATE, lone)
                return bool(rows) and rows[0]["state"] == "completed"

            took = await wait_for(restored, BACK_WITHIN, "the undone completion written again")
            again = log_events(worker, "job.completions_written_again")
            ran = await runs(url, QUEUE)
            everything = await fetch(
                url, "SELECT state::text AS state, count(*) AS n FROM jobs.job GROUP BY 1"
            )
            exited = worker.process.poll()
        finally:
            fleet.kill_all()
            node.stop()
    assert exited is None, f"the worker exited ({exited})"
    assert sum(e["restored"] for e in again) >= 1, (
        f"no completion was restored after the crash ({again}): the crash found it flushed"
    )
    assert {row["state"]: row["n"] for row in everything} == {"completed": len(first) + 1}
    assert not ran.duplicates, f"jobs ran twice: {ran.duplicates}"
    drill_report(
        f"server crash after a lazy completion: SIGKILL of every server process, restarted in"
        f" {back - killed:.1f}s; {sum(e['restored'] for e in again)} undone completion(s)"
        f" written again {took:.1f}s after the server was back; {len(first) + 1} jobs"
        " completed, none ran twice"
    )
