"""A claim commits and its answer is lost: the network fails between the server's commit and
the worker hearing of it. The jobs it took are active under a live worker, which no rescue
takes them from while it beats (it holds other jobs): before, they waited out their expiry (15
minutes here). An idle worker's beat is stale, so there its own rescue failed them as a lost
worker's after ``stale_seconds``, counting an attempt."""

from __future__ import annotations

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
from tests.support.dbproxy import DatabaseProxy

#: One daemon: runs in the second drill lane, beside the multi-process drills.
pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills-light")]

QUEUE = "drill-work"
#: In the text of both claim statements (plain and one-per-key), and no other.
CLAIM_TEXT = "SET state = 'active', started_at = now(), locked_by = "
#: The queue's expiry (its default): what the jobs of a lost answer waited for before.
EXPIRY = 900


async def test_a_claim_whose_answer_is_lost_runs_its_jobs_without_waiting_for_expiry(
    db_url: str, fleet: Fleet, drill_report
) -> None:
    """While a long job runs (so the worker beats), the proxy drops the worker's connection
    just after the server has committed the claim of the next 16 jobs' first 7, before the
    answer is forwarded. The worker hands back exactly those 7 (attempt 2 on their next claim,
    no failure counted; the long job is not touched) and every job runs exactly once, well
    before the 900 s expiry."""
    await create_ledger(db_url)
    proxy = DatabaseProxy(db_url)
    try:
        daemon = (await fleet.start_ready(proxy.url))[0]
        assert await fetch(db_url, "SELECT 1 FROM jobs.queue WHERE name = $1", QUEUE)
        assert (await fetch(db_url, "SELECT expire_seconds FROM jobs.queue WHERE name = $1",
                            QUEUE))[0][0] == EXPIRY  # fmt: skip
        async with Sender.connect(db_url, min_size=1, max_size=1) as sender:
            (long,) = await sender.send_many(QUEUE, [{"sleep": 120}])

            async def long_running() -> bool:
                return (await runs(db_url, QUEUE)).started[long] == 1

            await wait_for(long_running, 30, "the long job to start")
            proxy.lose_answer(CLAIM_TEXT, bound=QUEUE)
            ids = set(await sender.send_many(QUEUE, [{"sleep": 0.05}] * 16))

        async def all_done() -> bool:
            return not (await runs(db_url, QUEUE)).missing(ids)

        took = await wait_for(all_done, 60, "every job to run")
    finally:
        proxy.close()
    assert proxy.lost_answers == 1
    ledger = await runs(db_url, QUEUE)
    assert ledger.duplicates == {}
    assert ledger.started[long] == 1
    rows = await fetch(
        db_url,
        "SELECT id, attempt, retry_count, state::text FROM jobs.job WHERE id = ANY($1::bigint[])",
        [*ids, long],
    )
    again = {row["id"] for row in rows if row["attempt"] == 2}
    assert {row["attempt"] for row in rows} == {1, 2}
    assert {row["retry_count"] for row in rows} == {0}  # handed back: no failure counted
    assert [row["state"] for row in rows if row["id"] == long] == ["active"]
    handed = log_events(daemon, "poller.unanswered_claim_handed_back")
    assert [(e["queue"], sorted(e["job_ids"])) for e in handed] == [(QUEUE, sorted(again))]
    assert len(again) == 7  # the lost claim's: the free slots beside the long job
    assert log_events(daemon, "job.rescued") == []
    drill_report(
        f"unanswered claim: a claim's answer dropped after its commit while a long job ran ->"
        f" its {len(again)} jobs handed back and run on their second claim, no failure counted;"
        f" all {len(ids)} ran once, {took:.1f}s after the send (their expiry: {EXPIRY}s)"
    )
