"""Drill 13: a REPEATABLE READ transaction held open in the database while jobs churn."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from tests.drills.helpers import SCALE, Fleet, Load, create_ledger, fetch, runs, sized, wait_for

#: At most two daemons: runs in the second drill lane, beside the multi-process drills.
pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills-light")]

QUEUE = "drill-work"
RATE = 50  # jobs per second offered


async def dead_tuples_after_vacuum(url: str) -> int:
    """VACUUM the job table (autovacuum is off on the test server) and return the dead tuples
    it had to leave behind."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("VACUUM jobs.job")
        await asyncio.sleep(0.5)
        value = await conn.fetchval(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'jobs.job'::regclass"
        )
        return int(value)
    finally:
        await conn.close()


async def pickups(url: str, ids: set[int]) -> list[float]:
    """Seconds from send to first start of each job of ``ids``."""
    rows = await fetch(
        url,
        "SELECT extract(epoch FROM min(l.at) - j.created_at) AS s FROM public.drill_ledger l"
        " JOIN jobs.job j ON j.id = l.job_id WHERE l.job_id = ANY($1::bigint[])"
        " AND l.phase = 'start' GROUP BY l.job_id, j.created_at",
        list(ids),
    )
    return sorted(float(r["s"]) for r in rows)


async def test_a_long_transaction_does_not_stall_the_queue(db_url: str, fleet: Fleet, drill_report):
    """While a REPEATABLE READ transaction holds its snapshot open, jobs sent at a steady rate
    keep starting within a second and all complete; once it ends, a VACUUM clears the dead
    tuples it had pinned."""
    hold = sized(6.0, 60.0)
    await create_ledger(db_url)
    await fleet.start_ready(db_url, count=2)
    long_tx = await asyncpg.connect(db_url)
    try:
        async with Load(
            db_url, QUEUE, lambda _: {"sleep": 0.02}, batch=RATE // 5, every=0.2
        ) as load:
            await asyncio.sleep(2.0)
            transaction = long_tx.transaction(isolation="repeatable_read")
            await transaction.start()
            await long_tx.fetchval("SELECT count(*) FROM jobs.job")  # takes the snapshot
            began = time.time()
            await asyncio.sleep(hold)
            pinned = await dead_tuples_after_vacuum(db_url)
            during = {i for i, at in load.sent.items() if began <= at <= time.time()}
            await transaction.commit()
            await asyncio.sleep(2.0)
        ids = load.ids
    finally:
        await long_tx.close()

    async def all_done() -> bool:
        return not (await runs(db_url, QUEUE)).missing(ids)

    await wait_for(all_done, 60, "every job to complete")
    waits = await pickups(db_url, during)
    assert len(waits) == len(during)
    p95 = waits[int(len(waits) * 0.95)]
    assert p95 < 1.0, f"pickup p95 {p95:.2f}s during the long transaction"
    assert len(during) >= RATE * hold * 0.5, "the load itself stalled"
    cleared = await dead_tuples_after_vacuum(db_url)
    # Each job leaves at least two dead row versions (claim, completion) the snapshot pins.
    assert pinned >= len(during), f"only {pinned} dead tuples pinned: the snapshot held nothing"
    assert cleared < pinned / 10, f"{cleared} of {pinned} dead tuples left after the end"
    ledger = await runs(db_url, QUEUE)
    drill_report(
        f"drill 13 long transaction [{SCALE}: REPEATABLE READ snapshot held {hold:g}s, {RATE}"
        f" jobs/s, 2 workers]: {len(during)} jobs sent meanwhile started within p95"
        f" {p95 * 1000:.0f} ms (max {waits[-1] * 1000:.0f} ms); {pinned} dead tuples pinned by"
        f" the snapshot, {cleared} left after it ended and VACUUM ran; nothing lost"
        f" ({len(ids)}/{len(ids)} completed, {len(ledger.duplicates)} duplicates)"
    )
