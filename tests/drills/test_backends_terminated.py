"""Drill 6: every connection of the daemons terminated every 2 s for a while."""

from __future__ import annotations

import asyncio
import random
import time

import asyncpg
import pytest

from api_sender import Sender
from tests.drills.helpers import (
    SCALE,
    Fleet,
    Load,
    Watch,
    create_ledger,
    fetch,
    log_events,
    runs,
    sized,
    states,
    wait_for,
)

#: At most two daemons: runs in the second drill lane, beside the multi-process drills.
pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills-light")]

QUEUE = "drill-work"
#: Longer than any pickup this drill accepts: a job picked up sooner was woken by NOTIFY.
POLL = 2.0
SILENT_INSERT = """
INSERT INTO jobs.job (queue, data, retry_limit, retry_delay, retry_backoff, expire_seconds)
VALUES ($1, '{}'::jsonb, 10, 0, false, 900) RETURNING id
"""


async def pickup_seconds(url: str, job_id: int) -> float:
    """Seconds from a job's creation to the start of its first run."""

    async def started() -> bool:
        return bool(await fetch(url, "SELECT 1 FROM public.drill_ledger WHERE job_id = $1", job_id))

    await wait_for(started, 30, f"job {job_id} to start", step=0.02)
    rows = await fetch(
        url,
        "SELECT extract(epoch FROM min(l.at) - j.created_at) FROM public.drill_ledger l"
        " JOIN jobs.job j ON j.id = l.job_id WHERE l.job_id = $1 GROUP BY j.created_at",
        job_id,
    )
    return float(rows[0][0])


async def test_backends_terminated_every_two_seconds_lose_nothing(
    db_url: str, admin_url: str, fleet: Fleet, drill_report
):
    """pg_terminate_backend on every connection of the database every 2 s (pool, LISTEN,
    ledger) under load: the workers stay up, the listener comes back (new jobs start in well
    under one poll interval), polling finds a job sent without NOTIFY, and nothing is lost."""
    await create_ledger(db_url)
    daemons = await fleet.start_ready(db_url, {"POLL_INTERVAL_SECONDS": str(POLL)}, count=2)
    dbname = db_url.rsplit("/", 1)[1]
    duration = sized(8.0, 60.0)
    rng = random.Random(6)
    rounds = 0
    terminated = 0
    listeners = 0
    admin = await asyncpg.connect(admin_url)
    try:
        with Watch(daemons, paths=("/readyz",)) as watch:
            async with Load(
                db_url,
                QUEUE,
                lambda _: {"sleep": round(rng.uniform(0.05, 0.5), 2)},
                batch=5,
                every=0.2,
            ) as load:
                await asyncio.sleep(1.0)
                began = time.time()
                while time.time() - began < duration:
                    rows = await admin.fetch(
                        "SELECT application_name, pg_terminate_backend(pid) AS gone"
                        " FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
                        dbname,
                    )
                    rounds += 1
                    terminated += sum(1 for r in rows if r["gone"])
                    listeners += sum(
                        1 for r in rows if r["gone"] and "listener" in (r["application_name"] or "")
                    )
                    await asyncio.sleep(2.0)
                ended = time.time()
                await asyncio.sleep(1.0)
            ids = load.ids

            async def ready() -> bool:
                return all(
                    any(
                        s.pid == d.pid and s.status == 200 for s in watch.of("/readyz", since=ended)
                    )
                    for d in daemons
                )

            back = await wait_for(ready, 30, "both workers ready again", step=0.1)
    finally:
        await admin.close()
    assert [d.process.poll() for d in daemons] == [None, None], "a worker died"
    assert listeners >= rounds, "the listener connections were not among the terminated"
    # LISTEN is back: a job sent now starts long before the next poll would find it.
    async with Sender.connect(db_url, max_size=1) as sender:
        notified = []
        for _ in range(3):
            job_id = await sender.send(QUEUE, {})
            assert job_id is not None
            ids.add(job_id)
            notified.append(await pickup_seconds(db_url, job_id))
    assert max(notified) < 1.0, f"pickups {notified}: LISTEN is not back"
    # Polling is back: once the workers idle, a job inserted without NOTIFY is found within
    # one poll interval.
    await asyncio.sleep(1.0)
    silent = int((await fetch(db_url, SILENT_INSERT, QUEUE))[0][0])
    ids.add(silent)
    polled = await pickup_seconds(db_url, silent)
    assert polled < POLL + 0.5, f"a job sent without NOTIFY waited {polled:.1f}s"

    async def all_done() -> bool:
        return (await states(db_url, QUEUE))["completed"] >= len(ids)

    await wait_for(all_done, 60, "every job to complete")
    ledger = await runs(db_url, QUEUE)
    assert ledger.missing(ids) == set()
    chaos = {
        r["job_id"]
        for r in await fetch(
            db_url,
            "SELECT job_id FROM public.drill_ledger WHERE phase = 'start'"
            " GROUP BY job_id HAVING min(at) <= to_timestamp($1)",
            ended + 1.0,
        )
    }
    duplicated = set(ledger.duplicates)
    assert duplicated <= chaos, f"duplicates of jobs started after the chaos: {duplicated - chaos}"
    reconnects = min(len(log_events(d, "listener.reconnected")) for d in daemons)
    assert reconnects >= rounds - 1
    drill_report(
        f"drill 6 backends terminated [{SCALE}: every 2s for {duration:g}s, 2 workers, load 25"
        f" jobs/s]: {rounds} rounds, {terminated} backends terminated ({listeners} LISTEN"
        f" connections), workers up, listener reconnected {reconnects}+ times each, ready"
        f" {back:.1f}s after the last round; then NOTIFY pickups {max(notified) * 1000:.0f} ms max,"
        f" a job without NOTIFY polled in {polled:.1f}s (poll {POLL:g}s); nothing lost"
        f" ({len(ids)}/{len(ids)} completed, {len(duplicated)} duplicates, all among jobs in flight"
        " during the chaos)"
    )
