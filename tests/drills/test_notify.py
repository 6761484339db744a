"""Drill 7: NOTIFY semantics - rolled back, committed, a 1 MB payload, and no LISTEN at all."""

from __future__ import annotations

import asyncio
import random
import time

import asyncpg
import pytest

from api_sender import Sender
from tests.drills.helpers import SCALE, Fleet, create_ledger, fetch, runs, sized, wait_for

#: At most two daemons: runs in the second drill lane, beside the multi-process drills.
pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills-light")]

QUEUE = "drill-work"
#: The fallback poll: a pickup well under it was woken by NOTIFY.
POLL = 3.0
SILENT_INSERT = """
INSERT INTO jobs.job (queue, data, retry_limit, retry_delay, retry_backoff, expire_seconds)
VALUES ($1, '{}'::jsonb, 10, 0, false, 900) RETURNING id, extract(epoch FROM clock_timestamp())
"""


async def first_start(url: str, job_id: int, timeout: float) -> float:
    """When (epoch seconds) the first run of ``job_id`` started."""

    async def started() -> bool:
        return bool(await fetch(url, "SELECT 1 FROM public.drill_ledger WHERE job_id = $1", job_id))

    await wait_for(started, timeout, f"job {job_id} to start", step=0.02)
    rows = await fetch(
        url,
        "SELECT extract(epoch FROM min(at)) FROM public.drill_ledger WHERE job_id = $1",
        job_id,
    )
    return float(rows[0][0])


async def test_notify_is_transactional_fast_payload_free_and_polling_covers_its_loss(
    db_url: str, fleet: Fleet, drill_report
):
    """A send rolled back leaves no job and wakes nobody; a committed send starts in under
    1 s (the poll is 3 s); a 1 MB payload works as well; a job whose notification never comes
    (inserted without NOTIFY, or sent while the listener is down) runs within one poll."""
    await create_ledger(db_url)
    await fleet.start_ready(db_url, {"POLL_INTERVAL_SECONDS": str(POLL)})
    rng = random.Random(7)
    conn = await asyncpg.connect(db_url)
    try:
        async with Sender.connect(db_url, max_size=1) as sender:
            # Rolled back: no job, no run.
            transaction = conn.transaction()
            await transaction.start()
            rolled = await sender.send(QUEUE, {"n": "rolled back"}, connection=conn)
            assert rolled is not None
            await transaction.rollback()
            # Committed: the run starts within a second of the commit.
            committed = []
            for _ in range(sized(5, 20)):
                await asyncio.sleep(rng.uniform(0.2, 1.0))
                async with conn.transaction():
                    job_id = await sender.send(QUEUE, {"n": "committed"}, connection=conn)
                    assert job_id is not None
                    before_commit = time.time()
                committed.append((await first_start(db_url, job_id, 10)) - before_commit)
            # A 1 MB payload: the notification carries only the queue name.
            blob = {"blob": "x" * (1 << 20)}
            sent = time.time()
            big = await sender.send(QUEUE, blob)
            assert big is not None
            big_pickup = await first_start(db_url, big, 10) - sent
        await asyncio.sleep(1.5)
        assert await fetch(db_url, "SELECT 1 FROM jobs.job WHERE id = $1", rolled) == []
        assert (
            await fetch(db_url, "SELECT 1 FROM public.drill_ledger WHERE job_id = $1", rolled) == []
        )
        assert max(committed) < 1.0, f"pickups after commit: {committed}"
        assert big_pickup < 1.0, f"the 1 MB job started {big_pickup:.2f}s after its send"
        # No NOTIFY at all (a producer that bypasses it): found by the next poll.
        silent = []
        for _ in range(sized(2, 5)):
            await asyncio.sleep(rng.uniform(0.5, POLL))
            row = (await fetch(db_url, SILENT_INSERT, QUEUE))[0]
            silent.append(await first_start(db_url, int(row[0]), POLL + 5) - float(row[1]))
        assert max(silent) < POLL + 0.5, f"jobs without NOTIFY waited {silent}"
        # The listener is down when the job is sent (its NOTIFY reaches nobody): the poll that
        # follows the reconnect finds it.
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name LIKE '%listener%'"
        )
        sent = time.time()
        async with Sender.connect(db_url, max_size=1) as sender:
            lost = await sender.send(QUEUE, {"n": "listener down"})
        assert lost is not None
        lost_pickup = await first_start(db_url, lost, POLL + 5) - sent
        assert lost_pickup < POLL + 0.5
    finally:
        await conn.close()
    ledger = await runs(db_url, QUEUE)
    assert all(n == 1 for n in ledger.done.values())
    drill_report(
        f"drill 7 NOTIFY semantics [{SCALE}, poll {POLL:g}s]: rolled back -> no job, no run;"
        f" committed -> started {max(committed) * 1000:.0f} ms max after commit"
        f" ({len(committed)} sends); 1 MB payload -> started after {big_pickup * 1000:.0f} ms;"
        f" no NOTIFY -> found by the poll in {max(silent):.1f}s max ({len(silent)} jobs);"
        f" sent while the listener was down -> ran after {lost_pickup:.1f}s; nothing lost,"
        " nothing run twice"
    )
