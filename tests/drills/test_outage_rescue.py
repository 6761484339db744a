"""Drill 5b: a database outage longer than the stale limit, while replicas run long jobs."""

from __future__ import annotations

import asyncio
import time

import pytest

from api_sender import Sender
from tests.drills.helpers import (
    SCALE,
    Fleet,
    active_of,
    create_ledger,
    log_events,
    logged_at,
    runs,
    sized,
    states,
    wait_for,
    worker_id,
)
from tests.support.dbproxy import DatabaseProxy
from tests.support.processes import FAST_TIMINGS

#: Three or four daemons: runs in the multi-process drill lane.
pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills")]

QUEUE = "drill-work"
STALE = float(FAST_TIMINGS["WORKER_STALE_SECONDS"])
#: Jobs per replica: the drill queue's concurrency, so each replica holds a full set.
WIDTH = 8


async def test_an_outage_past_the_stale_limit_rescues_only_the_dead(
    db_url: str, fleet: Fleet, drill_report
):
    """Replicas running long jobs lose the database (each through its own cut link) for longer
    than the stale limit, one of them is SIGKILLed meanwhile, and the links come back a second
    apart: no replica rescues another live replica's jobs (each runs once, no lease is lost),
    while the dead replica's jobs are rescued, and only after the rescuer has had a full stale
    interval of database to let the others beat."""
    live_count = sized(2, 3)
    outage = sized(STALE + 3.0, 4 * STALE)
    stagger = 1.0
    # Long enough to run through the outage, the staggered return and one stale interval.
    sleep = outage + live_count * stagger + STALE + 4.0
    await create_ledger(db_url)
    proxies = [DatabaseProxy(db_url) for _ in range(live_count + 1)]
    try:
        daemons = await asyncio.gather(*(fleet.start_ready(p.url) for p in proxies))
        replicas = [d for [d] in daemons]
        *live, victim = replicas
        async with Sender.connect(db_url, max_size=1) as sender:
            ids = set(
                await sender.send_many(
                    QUEUE, [{"sleep": sleep, "sleep_once": True}] * (WIDTH * len(replicas))
                )
            )
        owners = {d.pid: worker_id(d) for d in replicas}

        async def all_running() -> bool:
            held = [await active_of(db_url, owners[d.pid]) for d in replicas]
            started = set((await runs(db_url, QUEUE)).started)
            return all(len(h) == WIDTH for h in held) and ids <= started

        await wait_for(all_running, 60, "every replica to run a full set of jobs", step=0.1)
        held = {d.pid: await active_of(db_url, owners[d.pid]) for d in replicas}
        for proxy in proxies:
            proxy.cut()
        cut_at = time.time()
        await asyncio.sleep(outage / 2)
        victim.kill()
        await asyncio.sleep(outage / 2)
        restored: dict[int, float] = {}
        for daemon, proxy in zip(replicas, proxies, strict=True):
            proxy.restore()
            restored[daemon.pid] = time.time()
            await asyncio.sleep(stagger)
        down_for = restored[live[0].pid] - cut_at

        async def all_completed() -> bool:
            return (await states(db_url, QUEUE))["completed"] == len(ids)

        await wait_for(all_completed, sleep + 60, "every job to complete")
        await asyncio.sleep(1.0)  # a late rescue or fenced write would show up now
    finally:
        for proxy in proxies:
            proxy.close()
    assert all(d.process.poll() is None for d in live), "a live replica exited"
    rescued = [(d, e) for d in live for e in log_events(d, "job.rescued")]
    wrongly = {int(e["job_id"]) for _, e in rescued} - held[victim.pid]
    assert not wrongly, f"live jobs rescued after the outage: {sorted(wrongly)}"
    assert {int(e["job_id"]) for _, e in rescued} == held[victim.pid]
    # Each rescue waited for a full stale interval of database on the replica that made it.
    waited = min(logged_at(e) - restored[d.pid] for d, e in rescued)
    assert waited >= STALE - 0.5, f"a rescue came {waited:.1f}s after the database returned"
    lost = sum(len(log_events(d, "job.lease_lost")) for d in live)
    assert lost == 0, f"{lost} outcomes of live jobs were fenced off"
    ledger = await runs(db_url, QUEUE)
    assert ledger.missing(ids) == set()
    live_jobs = set().union(*(held[d.pid] for d in live))
    assert {job: ledger.started[job] for job in live_jobs if ledger.started[job] != 1} == {}
    assert set(ledger.duplicates) == set()
    drill_report(
        f"drill 5b outage past the stale limit [{SCALE}]: {len(live)} live replicas and one"
        f" SIGKILLed during a {down_for:.1f}s outage (stale limit {STALE:g}s), links back"
        f" {stagger:g}s apart -> 0 of {len(live_jobs)} live jobs rescued, 0 lease lost, each run"
        f" once; the dead replica's {len(held[victim.pid])} jobs rescued {waited:.1f}s after the"
        f" rescuer's database returned; nothing lost ({len(ids)}/{len(ids)} completed)"
    )
