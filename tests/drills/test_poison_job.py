"""Drill 17: a job whose handler kills its worker every time."""

from __future__ import annotations

import asyncio
import time

import pytest

from api_sender import Sender
from tests.drills.helpers import SCALE, Fleet, create_ledger, fetch, log_events, runs, sized

pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills")]

QUEUE = "drill-poison"
DEAD = "drill-poison-dead"
ENV = {"TOOL_JOBS": "tests.support.tooljobs:DRILL_POISON"}
#: The poison queue's retry limit (tests/support/tooljobs.py): three attempts in all.
RETRY_LIMIT = 2


async def test_a_poison_job_runs_out_of_attempts_and_dead_letters_while_the_rest_flows(
    db_url: str, fleet: Fleet, drill_report
):
    """A job whose handler calls os._exit kills each worker that claims it; restarted like a
    container, the workers rescue it until its attempts run out and it moves to the dead
    letter; a job whose handler raises every time dead-letters too; every other job of the
    queue completes."""
    others = sized(150, 1500)
    await create_ledger(db_url)
    alive = await fleet.start_ready(db_url, ENV, count=2)
    async with Sender.connect(db_url, max_size=1) as sender:
        ids = set(await sender.send_many(QUEUE, [{"sleep": 0.05}] * (others // 2), retry_limit=10))
        [poison] = await sender.send_many(QUEUE, [{"exit": True}])
        [raiser] = await sender.send_many(QUEUE, [{"fail": True}])
    deaths = 0
    began = time.monotonic()

    async def settled() -> bool:
        states = await fetch(
            db_url,
            "SELECT state::text FROM jobs.job WHERE id = ANY($1::bigint[])",
            [poison, raiser],
        )
        ledger = await runs(db_url, QUEUE)
        return {r["state"] for r in states} == {"failed"} and not ledger.missing(ids)

    later = others - others // 2
    while not await settled():
        assert time.monotonic() - began < sized(90, 300), "the poison job never settled"
        for daemon in list(alive):
            if daemon.process.poll() is not None:
                assert daemon.process.returncode == 3, daemon.logs()
                deaths += 1
                alive.remove(daemon)
                alive.append(fleet.start(db_url, ENV))
                if deaths == 1:
                    # The rest arrives while the poison job is still going round.
                    async with Sender.connect(db_url, max_size=1) as sender:
                        batch = [{"sleep": 0.05}] * later
                        ids |= set(await sender.send_many(QUEUE, batch, retry_limit=10))
        await asyncio.sleep(0.2)
    took = time.monotonic() - began
    row = (
        await fetch(
            db_url,
            "SELECT retry_count, attempt, output->>'error' AS error FROM jobs.job WHERE id = $1",
            poison,
        )
    )[0]
    assert row["retry_count"] == RETRY_LIMIT + 1
    assert row["attempt"] == RETRY_LIMIT + 1
    assert deaths == RETRY_LIMIT + 1, f"{deaths} worker deaths"
    raised = (
        await fetch(
            db_url,
            "SELECT retry_count, output->>'error' AS error FROM jobs.job WHERE id = $1",
            raiser,
        )
    )[0]
    assert raised["retry_count"] == RETRY_LIMIT + 1
    # Its last attempt may have shared a worker with the other poison job and been rescued.
    assert "asked to fail" in raised["error"] or raised["error"].startswith("rescued")
    dead = await fetch(db_url, "SELECT data::text AS data FROM jobs.job WHERE queue = $1", DEAD)
    assert sorted(r["data"] for r in dead) == ['{"exit": true}', '{"fail": true}']

    async def dead_letter_handled() -> bool:
        rows = await fetch(
            db_url, "SELECT 1 FROM public.drill_ledger WHERE queue = $1 AND phase = 'dead'", DEAD
        )
        return len(rows) == 2

    # Patient: a worker restarted after the last death may still be booting, and the parallel
    # suite can keep both busy for seconds (10 s was once too short under `make test`).
    for _ in range(300):
        if await dead_letter_handled():
            break
        await asyncio.sleep(0.1)
    assert await dead_letter_handled(), [d.logs()[-2000:] for d in alive]
    ledger = await runs(db_url, QUEUE)
    assert ledger.missing(ids) == set()
    assert ledger.started[poison] == RETRY_LIMIT + 1
    # Only jobs on a worker the poison job killed may have run twice: those were rescued.
    rescued = {int(e["job_id"]) for d in fleet.all for e in log_events(d, "job.rescued")}
    assert set(ledger.duplicates) <= rescued
    drill_report(
        f"drill 17 poison job [{SCALE}: 1 job calling os._exit and 1 raising, among {others}, 2"
        f" workers restarted on exit]: the first killed {deaths} workers (attempts"
        f" {row['attempt']}, retry limit {RETRY_LIMIT}) and ended failed ('{row['error']}'), the"
        f" second failed {raised['retry_count']} times; both copies in the dead letter and"
        f" handled there, in {took:.0f}s; the rest flowed: nothing lost"
        f" ({len(ids)}/{len(ids)} completed, {len(ledger.duplicates)} duplicates, all among"
        " jobs on a killed worker)"
    )
