"""The completer: outcomes written in batches, and one unwritable row sinking none of the rest."""

from __future__ import annotations

import uuid

import pytest

from api_sender import Sender
from tests.support.queues import make_queue
from worker.queue.completer import Completer
from worker.queue.holdings import Holdings
from worker.queue.sql import render
from worker.queue.store import JobStore

SQL = render("jobs")

#: A trigger that refuses any write moving one job out of state active (a non-transient error).
REFUSE = """
CREATE FUNCTION public.refuse_outcome() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'outcome refused by the test' USING ERRCODE = '23514'; END $$;
CREATE TRIGGER refuse_outcome BEFORE UPDATE ON jobs.job FOR EACH ROW
    WHEN (OLD.id = {job_id} AND NEW.state <> 'active') EXECUTE FUNCTION public.refuse_outcome();
"""


@pytest.mark.parametrize("refused_in", ["done", "failed", "back"])
async def test_one_refused_outcome_leaves_every_other_written(
    pool, sender: Sender, captured_logs, refused_in: str
) -> None:
    """When the database refuses one job's outcome, its batch is written in smaller parts:
    every other success, failure and hand-back of the flush is written, and the refused job
    alone is logged as given up."""
    await make_queue(pool, "q", retry_limit=0)
    await sender.send_many("q", [{"n": n} for n in range(9)])
    store = JobStore(pool, SQL, uuid.uuid4())
    holdings = Holdings()
    completer = Completer(store, holdings)
    jobs = await store.claim("q", 9)
    holdings.add(len(jobs))
    groups = {"done": jobs[0:3], "failed": jobs[3:6], "back": jobs[6:9]}
    refused = groups[refused_in][1]
    await pool.execute(REFUSE.format(job_id=int(refused.id)))
    for job in groups["done"]:
        completer.succeeded(job)
    for job in groups["failed"]:
        completer.failed(job, "boom")
    for job in groups["back"]:
        completer.handed_back(job)
    await completer.flush()
    rows = await pool.fetch("SELECT id, state::text AS state FROM jobs.job")
    state = {r["id"]: r["state"] for r in rows}
    expected = {"done": "completed", "failed": "failed", "back": "retry"}
    for group, members in groups.items():
        for job in members:
            assert state[job.id] == ("active" if job is refused else expected[group])
    given_up = [e for e in captured_logs if e["event"] == "job.outcome_given_up"]
    assert [e["ids"] for e in given_up] == [[refused.id]]
    assert holdings.count == 0
