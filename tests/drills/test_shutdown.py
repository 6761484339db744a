"""Drills 2 and 3: a graceful stop (SIGTERM), and a second signal that forces the exit."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from api_sender import Sender
from tests.drills.helpers import (
    SCALE,
    Fleet,
    create_ledger,
    fetch,
    runs,
    sized,
    states,
    wait_for,
)
from tests.support.processes import FAST_TIMINGS

pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills")]

QUEUE = "drill-work"
GRACE = float(FAST_TIMINGS["SHUTDOWN_GRACE_SECONDS"])
#: Handlers of the drill queue running at once in one process (tests/support/tooljobs.py).
WIDTH = 8


async def started_count(url: str, pid: int) -> int:
    """Handler runs that started in process ``pid``."""
    rows = await fetch(
        url, "SELECT count(*) FROM public.drill_ledger WHERE phase = 'start' AND pid = $1", pid
    )
    return int(rows[0][0])


async def test_graceful_stop_finishes_short_jobs_and_hands_back_long_ones(
    db_url: str, fleet: Fleet, drill_report
):
    """SIGTERM with short jobs in flight: they finish, the rest wait, 0 duplicates, exit 0 well
    before the grace; SIGTERM with jobs longer than the grace: exit 0 right after it, every long
    job back in the queue at once with its attempt intact, and run again at once elsewhere."""
    await create_ledger(db_url)
    short_jobs = sized(60, 400)
    [first] = await fleet.start_ready(db_url)
    async with Sender.connect(db_url, max_size=1) as sender:
        short = set(await sender.send_many(QUEUE, [{"sleep": 0.3} for _ in range(short_jobs)]))

    async def busy() -> bool:
        return await started_count(db_url, first.pid) >= WIDTH

    await wait_for(busy, 30, "handlers to start", step=0.05)
    signalled = time.monotonic()
    first.signal(signal.SIGTERM)
    assert await asyncio.to_thread(first.wait, 30) == 0, first.logs()
    short_exit = time.monotonic() - signalled
    assert short_exit < GRACE, f"exit took {short_exit:.1f}s"
    after_stop = await runs(db_url, QUEUE)
    unfinished = set(after_stop.started) - set(after_stop.done)
    assert unfinished == set(), f"handlers cut short by a graceful stop: {unfinished}"
    [second] = await fleet.start_ready(db_url)

    async def short_done() -> bool:
        return (await states(db_url, QUEUE))["completed"] == short_jobs

    await wait_for(short_done, 60, "the short jobs to complete")
    ledger = await runs(db_url, QUEUE)
    assert ledger.missing(short) == set()
    assert ledger.duplicates == {}
    assert {n for job, n in ledger.started.items() if job in short} == {1}

    # Jobs longer than the grace: interrupted at its end and handed back without an attempt.
    async with Sender.connect(db_url, max_size=1) as sender:
        long = set(await sender.send_many(QUEUE, [{"sleep": 60, "sleep_once": True}] * WIDTH))

    async def long_running() -> bool:
        return len(set((await runs(db_url, QUEUE)).started) & long) == WIDTH

    await wait_for(long_running, 30, "the long jobs to start", step=0.05)
    third = (await fleet.start_ready(db_url))[0]
    signalled = time.monotonic()
    second.signal(signal.SIGTERM)
    assert await asyncio.to_thread(second.wait, 30) == 0, second.logs()
    long_exit = time.monotonic() - signalled
    exited_at = time.time()
    assert GRACE - 0.5 < long_exit < GRACE + 2.0, f"exit took {long_exit:.1f}s"

    async def long_done() -> bool:
        return len(set((await runs(db_url, QUEUE)).done) & long) == WIDTH

    await wait_for(long_done, 30, "the handed-back jobs to run again")
    rows = await fetch(
        db_url,
        "SELECT j.id, j.retry_count, j.attempt, j.state::text AS state,"
        " (SELECT min(extract(epoch FROM l.at)) FROM public.drill_ledger l"
        "  WHERE l.job_id = j.id AND l.phase = 'start' AND l.pid = $2) AS restarted"
        " FROM jobs.job j WHERE j.id = ANY($1::bigint[])",
        list(long),
        third.pid,
    )
    assert {(r["state"], r["retry_count"], r["attempt"]) for r in rows} == {("completed", 0, 2)}
    back_in = max(float(r["restarted"]) for r in rows) - exited_at
    assert back_in < 1.0, f"the handed-back jobs waited {back_in:.1f}s"
    drill_report(
        f"drill 2 graceful stop [{SCALE}, grace {GRACE:g}s]: SIGTERM with {WIDTH} short jobs"
        f" running -> they finished, exit 0 after {short_exit:.1f}s, 0 duplicates"
        f" ({short_jobs}/{short_jobs} completed once); SIGTERM with {WIDTH} jobs longer than the"
        f" grace -> exit 0 after {long_exit:.1f}s, all handed back with retry_count 0 and run"
        f" again elsewhere {max(0.0, back_in):.1f}s after the exit; nothing lost"
    )


async def test_second_signal_forces_the_exit_and_leftovers_are_recovered(
    db_url: str, fleet: Fleet, drill_report
):
    """SIGTERM then SIGINT a second later: the process exits within 1 s of the second signal
    (status 1); the jobs it held are rescued and completed on another replica, duplicates only
    among them."""
    await create_ledger(db_url)
    [victim] = await fleet.start_ready(db_url)
    async with Sender.connect(db_url, max_size=1) as sender:
        ids = set(
            await sender.send_many(QUEUE, [{"sleep": 30, "sleep_once": True}] * WIDTH)
            + await sender.send_many(QUEUE, [{"sleep": 0.2}] * sized(40, 200))
        )

    async def busy() -> bool:
        return await started_count(db_url, victim.pid) >= WIDTH

    await wait_for(busy, 30, "handlers to start", step=0.05)
    held = {
        r["id"]
        for r in await fetch(
            db_url, "SELECT id FROM jobs.job WHERE state = 'active' AND queue = $1", QUEUE
        )
    }
    victim.signal(signal.SIGTERM)
    await asyncio.sleep(1.0)
    forced = time.monotonic()
    victim.signal(signal.SIGINT)
    code = await asyncio.to_thread(victim.wait, 10)
    forced_exit = time.monotonic() - forced
    killed_at = time.time()
    assert code == 1, victim.logs()
    assert forced_exit < 1.0, f"forced exit took {forced_exit:.2f}s"
    [rescuer] = await fleet.start_ready(db_url)

    async def all_done() -> bool:
        return (await states(db_url, QUEUE))["completed"] == len(ids)

    await wait_for(all_done, 60, "every job to complete")
    ledger = await runs(db_url, QUEUE)
    assert ledger.missing(ids) == set()
    assert set(ledger.duplicates) <= held
    rows = await fetch(
        db_url,
        "SELECT max(extract(epoch FROM at)) FROM public.drill_ledger"
        " WHERE phase = 'start' AND pid = $1 AND job_id = ANY($2::bigint[])",
        rescuer.pid,
        list(held),
    )
    recovered = float(rows[0][0]) - killed_at
    assert recovered < 10.0, f"leftovers came back after {recovered:.1f}s"
    drill_report(
        f"drill 3 second signal [{SCALE}]: SIGTERM, SIGINT 1s later -> forced exit (status 1)"
        f" {forced_exit:.2f}s after it; its {len(held)} jobs rescued and re-run within"
        f" {recovered:.1f}s; nothing lost ({len(ids)}/{len(ids)} completed,"
        f" {len(ledger.duplicates)} duplicates, all among the in-flight)"
    )
