"""Drill 1: a worker SIGKILLed mid-job, again and again, while three replicas share the work."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from api_sender import Sender
from tests.drills.helpers import (
    SCALE,
    Fleet,
    active_of,
    create_ledger,
    fetch,
    log_events,
    logged_at,
    runs,
    sized,
    states,
    wait_for,
    worker_id,
)

pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills")]

QUEUE = "drill-work"
#: Rescue bound R: a dead worker's jobs are back in the queue within this many seconds.
R = 10.0


async def test_workers_killed_mid_job_lose_nothing(db_url: str, fleet: Fleet, drill_report):
    """Three replicas work through jobs of 0.2-2 s while one of them is SIGKILLed every few
    seconds and restarted: every job completes, only jobs in flight at a kill run twice, and
    each killed worker's jobs are back in the queue within R."""
    jobs = sized(300, 2000)
    every = sized(4.0, 15.0)
    longest = sized(1.0, 2.0)
    rng = random.Random(1)
    await create_ledger(db_url)
    replicas = await fleet.start_ready(db_url, count=3)
    async with Sender.connect(db_url, max_size=1) as sender:
        ids = set(
            await sender.send_many(
                QUEUE, [{"sleep": round(rng.uniform(0.2, longest), 2)} for _ in range(jobs)]
            )
        )
    # (pid, worker id, instant, the jobs it held) for every kill.
    kills: list[tuple[int, str, float, set[int]]] = []
    while (await states(db_url, QUEUE))["completed"] < jobs * 0.8 or not kills:
        await asyncio.sleep(every)
        victim = rng.choice(replicas)
        owner = worker_id(victim)
        held = await active_of(db_url, owner)
        victim.kill()
        kills.append((victim.pid, owner, time.time(), held))
        replicas.remove(victim)
        replacement = fleet.start(db_url)
        replicas.append(replacement)
        await asyncio.to_thread(replacement.wait_ready, 60)

    async def all_done() -> bool:
        return (await states(db_url, QUEUE))["completed"] == jobs

    await wait_for(all_done, sized(90, 300), "every job to complete")
    ledger = await runs(db_url, QUEUE)
    assert ledger.missing(ids) == set()
    # Orphans: each job a victim held is back in the queue (rescued) within R of the kill, or
    # had finished on the victim just before it. Rescued jobs queue behind the backlog sent
    # before them, so when they run again depends on that backlog; it is reported, not bound.
    rescues = {
        (str(e["worker_id"]), int(e["job_id"])): logged_at(e)
        for d in fleet.all
        for e in log_events(d, "job.rescued")
    }
    in_flight: set[int] = set()
    delays = []
    reruns = []
    for pid, owner, at, held in kills:
        orphans = {job for (w, job) in rescues if w == owner}
        in_flight |= held | orphans
        for job in held - orphans:
            # The server stamps the ledger line when it receives it: a line the victim sent just
            # before the signal landed can carry an instant a little after the kill was recorded
            # here (seen once: a job completed by the victim, its 'done' line past the kill).
            finished = await fetch(
                db_url,
                "SELECT 1 FROM public.drill_ledger WHERE job_id = $1 AND pid = $2"
                " AND phase = 'done' AND extract(epoch FROM at) <= $3",
                job,
                pid,
                at + 1.0,
            )
            assert finished, f"job {job} of a killed worker was never rescued"
        delays.extend(rescues[(owner, job)] - at for job in orphans)
        rows = await fetch(
            db_url,
            "SELECT min(extract(epoch FROM at)) AS next FROM public.drill_ledger"
            " WHERE phase = 'start' AND job_id = ANY($1::bigint[]) AND pid <> $2"
            " AND extract(epoch FROM at) > $3 GROUP BY job_id",
            list(orphans),
            pid,
            at,
        )
        assert len(rows) == len(orphans), "a rescued job never started again"
        reruns.extend(float(row["next"]) - at for row in rows)
    assert delays, "no kill landed while the victim held jobs"
    worst = max(delays)
    assert worst < R, f"an orphan waited {worst:.1f}s to be rescued"
    duplicated = set(ledger.duplicates)
    assert duplicated <= in_flight, (
        f"duplicates outside the in-flight jobs: {duplicated - in_flight}"
    )
    drill_report(
        f"drill 1 worker killed mid-job [{SCALE}: {jobs} jobs of 0.2-{longest:g}s, 3 replicas,"
        f" {len(kills)} SIGKILLs every {every:g}s]: {len(in_flight)} jobs in flight at the kills,"
        f" all back in the queue within {worst:.1f}s (R={R:g}s) and run again within"
        f" {max(reruns):.1f}s (behind the backlog); nothing lost ({jobs}/{jobs} completed,"
        f" {len(duplicated)} duplicates, all among the in-flight)"
    )
