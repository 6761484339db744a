"""Drill 4: a replica frozen (SIGSTOP) past the stale limit, then resumed (SIGCONT)."""

from __future__ import annotations

import asyncio
import signal
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
    metric,
    runs,
    sized,
    states,
    wait_for,
    worker_id,
)

#: At most two daemons: runs in the second drill lane, beside the multi-process drills.
pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills-light")]

QUEUE = "drill-work"
WIDTH = 8


async def test_a_paused_replicas_jobs_run_elsewhere_and_its_late_writes_are_fenced(
    db_url: str, fleet: Fleet, drill_report
):
    """SIGSTOP a replica holding jobs until another has rescued and completed them, then
    SIGCONT: its late completions match no row, each is logged as job.lease_lost and counted in
    jobs_lease_lost_total, and the jobs stay completed by the replica that ran them."""
    await create_ledger(db_url)
    [frozen] = await fleet.start_ready(db_url)
    async with Sender.connect(db_url, max_size=1) as sender:
        ids = set(await sender.send_many(QUEUE, [{"sleep": 3, "sleep_once": True}] * WIDTH))
        more = sized(40, 400)
    frozen_id = worker_id(frozen)

    async def holding() -> bool:
        return (
            len(await active_of(db_url, frozen_id)) == WIDTH
            and len(set((await runs(db_url, QUEUE)).started) & ids) == WIDTH
        )

    await wait_for(holding, 30, "the first replica to run every job", step=0.05)
    frozen.signal(signal.SIGSTOP)
    stopped = time.monotonic()
    held = await active_of(db_url, frozen_id)
    [other] = await fleet.start_ready(db_url)
    async with Sender.connect(db_url, max_size=1) as sender:
        ids |= set(await sender.send_many(QUEUE, [{"sleep": 0.1}] * more))

    async def ran_elsewhere() -> bool:
        rows = await fetch(
            db_url,
            "SELECT count(DISTINCT job_id) FROM public.drill_ledger"
            " WHERE phase = 'done' AND pid = $1 AND job_id = ANY($2::bigint[])",
            other.pid,
            list(held),
        )
        return int(rows[0][0]) == len(held) and (await states(db_url, QUEUE))["completed"] == len(
            ids
        )

    await wait_for(ran_elsewhere, 60, "the frozen replica's jobs to complete elsewhere")
    frozen_for = time.monotonic() - stopped
    completed_before = {
        r["id"]: (r["locked_by"], r["completed_at"])
        for r in await fetch(
            db_url, "SELECT id, locked_by, completed_at FROM jobs.job WHERE queue = $1", QUEUE
        )
    }
    frozen.signal(signal.SIGCONT)

    def lost() -> list[int]:
        return [e["job_id"] for e in log_events(frozen, "job.lease_lost")]

    async def fenced() -> bool:
        return len(lost()) >= len(held)

    await wait_for(fenced, 30, "the late completions to be refused")
    await asyncio.sleep(1.0)  # anything more would show up now
    assert sorted(lost()) == sorted(held)
    assert {e["write"] for e in log_events(frozen, "job.lease_lost")} == {"complete"}
    counted = metric(frozen, "jobs_lease_lost_total", queue=QUEUE)
    assert counted == len(held)
    after = {
        r["id"]: (r["locked_by"], r["completed_at"])
        for r in await fetch(
            db_url, "SELECT id, locked_by, completed_at FROM jobs.job WHERE queue = $1", QUEUE
        )
    }
    assert after == completed_before, "a late write changed a finished job"
    ledger = await runs(db_url, QUEUE)
    assert ledger.missing(ids) == set()
    assert set(ledger.duplicates) == held  # the frozen replica's own late runs, nothing else
    await asyncio.to_thread(frozen.wait_ready, 30)
    drill_report(
        f"drill 4 paused process [{SCALE}]: SIGSTOP {frozen_for:.1f}s (stale limit 5s) while"
        f" holding {len(held)} jobs -> they ran elsewhere; SIGCONT -> its {len(held)} late"
        f" completions matched 0 rows, {len(lost())} job.lease_lost logged,"
        f" jobs_lease_lost_total={counted:g}, the replica ready again; nothing lost"
        f" ({len(ids)}/{len(ids)} completed, {len(ledger.duplicates)} duplicates = the frozen"
        " replica's late runs)"
    )
