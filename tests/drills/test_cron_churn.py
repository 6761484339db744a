"""Drill 11: a per-second cron on several replicas while they are SIGKILLed and restarted."""

from __future__ import annotations

import asyncio
import random
import time
from datetime import datetime

import pytest

from tests.drills.helpers import SCALE, Fleet, create_ledger, fetch, runs, sized, wait_for

pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills")]

QUEUE = "drill-cron"
ENV = {"TOOL_JOBS": "tests.support.tooljobs:DRILL_CRON"}


async def test_cron_fires_once_per_slot_while_replicas_churn(
    db_url: str, fleet: Fleet, drill_report
):
    """Replicas share a cron that ticks every second while one of them is SIGKILLed and
    restarted every few seconds: every slot is enqueued at most once, almost none is missed,
    and every enqueued run completes."""
    replicas = sized(3, 5)
    duration = sized(10.0, 180.0)
    rng = random.Random(11)
    await create_ledger(db_url)
    alive = await fleet.start_ready(db_url, ENV, count=replicas)
    kills = 0
    began = time.monotonic()
    while time.monotonic() - began < duration:
        await asyncio.sleep(rng.uniform(1.0, 4.0))
        victim = rng.choice(alive)
        victim.kill()
        kills += 1
        alive.remove(victim)
        alive.append(fleet.start(db_url, ENV))
    for daemon in alive:
        await asyncio.to_thread(daemon.wait_ready, 60)
    await asyncio.sleep(2.0)
    for daemon in fleet.running():
        daemon.kill()
    rows = await fetch(
        db_url,
        "SELECT singleton_key, count(*) AS n FROM jobs.job WHERE queue = $1 GROUP BY 1",
        QUEUE,
    )
    assert rows, "the cron never fired"
    doubled = [r["singleton_key"] for r in rows if r["n"] != 1]
    assert doubled == [], f"slots enqueued more than once: {doubled[:5]}"
    slots = sorted(
        datetime.fromisoformat(r["singleton_key"].removeprefix("cron:").replace("Z", "+00:00"))
        for r in rows
    )
    span = int((slots[-1] - slots[0]).total_seconds()) + 1
    missed = span - len(slots)
    assert missed <= max(2, span // 50), f"{missed} of {span} slots never fired"
    # Every enqueued run completes (a survivor rescues the killed replicas' runs).
    ids = {r["id"] for r in await fetch(db_url, "SELECT id FROM jobs.job WHERE queue = $1", QUEUE)}
    await fleet.start_ready(db_url, ENV)

    async def all_ran() -> bool:
        return not (await runs(db_url, QUEUE)).missing(ids)

    await wait_for(all_ran, 60, "every cron run to complete")
    drill_report(
        f"drill 11 cron with churn [{SCALE}: {replicas} replicas, per-second cron, {kills} SIGKILLs"
        f" and restarts over {duration:g}s]: {len(slots)} slots over {span}s, each enqueued"
        f" exactly once (0 doubles, {missed} missed); nothing lost ({len(ids)}/{len(ids)} runs"
        " completed)"
    )
