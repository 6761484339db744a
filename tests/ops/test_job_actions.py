"""Job management through ``sender.jobs``: what each action moves, what it leaves, its audit row."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from api_sender import Actor, InvalidArgument, Sender
from tests.support.queues import make_queue
from worker.queue.sql import render
from worker.queue.store import JobStore

SQL = render("jobs")


async def states(pool: asyncpg.Pool, *ids: int) -> list[str | None]:
    """The state of each job id (``None`` when the row is gone)."""
    rows = await pool.fetch("SELECT id, state::text AS s FROM jobs.job WHERE id = ANY($1)", ids)
    found = {row["id"]: row["s"] for row in rows}
    return [found.get(i) for i in ids]


async def one_of_each(pool: asyncpg.Pool, sender: Sender, queue: str = "q") -> dict[str, int]:
    """One job in every state, on ``queue``: ``{state: id}``."""
    await make_queue(pool, queue, retry_limit=0)
    ids = {s: await sender.send(queue, {"s": s}) for s in ("active", "completed", "failed")}
    store = JobStore(pool, SQL, uuid.uuid4())
    claimed = await store.claim(queue, 3)
    by_id = {job.id: job for job in claimed}
    await store.complete([by_id[ids["completed"]]])
    await store.fail([(by_id[ids["failed"]], "boom")])
    ids["created"] = await sender.send(queue, {"s": "created"})
    ids["retry"] = await sender.send(queue, {"s": "retry"})
    ids["cancelled"] = await sender.send(queue, {"s": "cancelled"})
    await pool.execute("UPDATE jobs.job SET state = 'retry' WHERE id = $1", ids["retry"])
    await pool.execute(
        "UPDATE jobs.job SET state = 'cancelled', completed_at = now() WHERE id = $1",
        ids["cancelled"],
    )
    assert await states(pool, *ids.values()) == list(ids)
    return ids


async def audit_rows(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    """Every audit row, oldest first."""
    return await pool.fetch("SELECT * FROM public.audit_log ORDER BY id")


@pytest.mark.parametrize(
    ("action", "moves", "to"),
    [
        ("retry", {"failed", "cancelled"}, "retry"),
        ("cancel", {"created", "retry", "active"}, "cancelled"),
        ("resume", {"cancelled"}, "created"),
        ("delete", {"created", "retry", "active", "completed", "cancelled", "failed"}, None),
    ],
)
async def test_each_action_moves_its_states_and_leaves_the_rest(
    pool: asyncpg.Pool, sender: Sender, action: str, moves: set[str], to: str | None
) -> None:
    """An action by ids changes exactly the jobs in the states it acts on, returns their ids,
    and leaves every other id alone without an error."""
    ids = await one_of_each(pool, sender)
    changed = await getattr(sender.jobs, action)(list(ids.values()))
    assert changed == sorted(ids[s] for s in moves)
    after = await states(pool, *ids.values())
    for (before, job_id), now in zip(ids.items(), after, strict=True):
        assert now == (to if before in moves else before), (before, job_id, now)


async def test_retry_of_an_exhausted_job_grants_exactly_one_more_attempt(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """A failed job with no retries left is due again at once; failing again ends it failed."""
    await make_queue(pool, "q", retry_limit=1)
    job_id = await sender.send("q", {})
    store = JobStore(pool, SQL, uuid.uuid4())
    for _ in range(2):
        await pool.execute("UPDATE jobs.job SET start_after = now() WHERE id = $1", job_id)
        [job] = await store.claim("q", 1)
        await store.fail([(job, "boom")])
    assert await states(pool, job_id) == ["failed"]
    assert await sender.jobs.retry([job_id]) == [job_id]
    row = await pool.fetchrow(
        "SELECT *, start_after <= now() AS due FROM jobs.job WHERE id = $1", job_id
    )
    assert (row["state"], row["due"], row["completed_at"]) == ("retry", True, None)
    [job] = await store.claim("q", 1)
    [outcome] = await store.fail([(job, "boom again")])
    assert outcome.state == "failed"


async def test_cancel_of_an_active_job_fences_its_late_outcome(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """After a cancel, the running worker's completion matches no row: the job stays cancelled."""
    await make_queue(pool, "q")
    job_id = await sender.send("q", {})
    store = JobStore(pool, SQL, uuid.uuid4())
    [job] = await store.claim("q", 1)
    assert await sender.jobs.cancel([job_id]) == [job_id]
    assert await store.complete([job]) == set()
    assert await store.fail([(job, "late")]) == []
    assert await store.hand_back([job]) == set()
    assert await states(pool, job_id) == ["cancelled"]


async def test_cancel_of_an_active_job_notifies_its_owner(
    pool: asyncpg.Pool, sender: Sender, db_url: str
) -> None:
    """The cancel statement tells the owning replica, on commit, which of its jobs to stop."""
    await make_queue(pool, "q")
    job_id = await sender.send("q", {})
    store = JobStore(pool, SQL, uuid.uuid4())
    await store.claim("q", 1)
    heard: list[str] = []
    listener = await asyncpg.connect(db_url)
    try:
        await listener.add_listener("chassis_cancel_jobs", lambda *a: heard.append(a[-1]))
        await sender.jobs.cancel([job_id])
        await listener.execute("SELECT 1")
    finally:
        await listener.close()
    assert heard == [f"{store.owner} {job_id}"]


async def test_resume_never_breaks_a_short_queue_policy(pool: asyncpg.Pool, sender: Sender) -> None:
    """A cancelled job whose key already has a job waiting stays cancelled; the others resume."""
    await make_queue(pool, "short-q", policy="short")
    first = await sender.send("short-q", {}, singleton_key="k")
    other = await sender.send("short-q", {}, singleton_key="other")
    assert await sender.jobs.cancel([first, other]) == sorted([first, other])
    waiting = await sender.send("short-q", {}, singleton_key="k")
    assert waiting is not None
    assert await sender.jobs.resume([first, other]) == [other]
    assert await states(pool, first, other, waiting) == ["cancelled", "created", "created"]


async def test_every_action_writes_one_audit_row(pool: asyncpg.Pool, sender: Sender) -> None:
    """Each action by ids records the actor, the action, the ids it changed and their count."""
    ids = await one_of_each(pool, sender)
    jobs = sender.jobs.as_actor(Actor("cli", "alice"))
    await jobs.retry([ids["failed"]])
    await jobs.cancel([ids["created"], ids["completed"]])
    rows = await audit_rows(pool)
    assert [(r["actor_via"], r["principal"], r["action"], r["resource_type"]) for r in rows] == [
        ("cli", "alice", "job.retry", "job"),
        ("cli", "alice", "job.cancel", "job"),
    ]
    assert rows[0]["resource_id"] == str(ids["failed"])
    assert rows[1]["resource_id"] is None
    meta = (
        json.loads(rows[1]["metadata"])
        if isinstance(rows[1]["metadata"], str)
        else rows[1]["metadata"]
    )
    assert meta["ids"] == [ids["created"]]
    assert meta["count"] == 1
    assert sorted(meta["requested"]) == sorted([ids["created"], ids["completed"]])


async def test_a_filter_action_counts_first_and_changes_only_when_asked(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """A dry run counts and changes nothing (no audit row); the live run changes exactly those
    jobs of that queue and state, within the time bounds, with one audit row naming the filter."""
    ids = await one_of_each(pool, sender, "q")
    other = await one_of_each(pool, sender, "other")
    cancelled_again = await sender.send("q", {})
    await sender.jobs.cancel([cancelled_again])
    await pool.execute("DELETE FROM public.audit_log")
    assert await sender.jobs.retry_where(queue="q", state="cancelled") == 2
    assert await states(pool, ids["cancelled"], cancelled_again) == ["cancelled", "cancelled"]
    assert await audit_rows(pool) == []
    future = datetime.now(UTC) + timedelta(days=1)
    assert await sender.jobs.retry_where(queue="q", state="cancelled", since=future) == 0
    assert await sender.jobs.retry_where(queue="q", state="cancelled", dry_run=False) == 2
    assert await states(pool, ids["cancelled"], cancelled_again, other["cancelled"]) == [
        "retry",
        "retry",
        "cancelled",
    ]
    [row] = await audit_rows(pool)
    meta = json.loads(row["metadata"]) if isinstance(row["metadata"], str) else row["metadata"]
    assert row["action"] == "job.retry"
    assert meta == {
        "filter": {"queue": "q", "state": "cancelled", "since": None, "until": None},
        "count": 2,
        "skipped": 0,
    }


async def test_a_filter_only_matches_the_states_its_action_moves(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """``cancel_where`` without a state takes created, retry and active; with state=completed
    it matches nothing."""
    await one_of_each(pool, sender)
    assert await sender.jobs.cancel_where(queue="q") == 3
    assert await sender.jobs.cancel_where(queue="q", state="completed") == 0


async def test_list_is_newest_first_and_pages_by_keyset(pool: asyncpg.Pool, sender: Sender) -> None:
    """Pages of a filtered list join up to every matching job, newest first, none twice."""
    await make_queue(pool, "q")
    await make_queue(pool, "other")
    sent = await sender.send_many("q", [{"n": n} for n in range(25)])
    await sender.send_many("other", [{"n": n} for n in range(5)])
    seen: list[int] = []
    after = None
    while True:
        page = await sender.jobs.list(queue="q", state="created", limit=10, after=after)
        seen.extend(job.id for job in page.jobs)
        if page.next is None:
            break
        after = page.next
    assert seen == sorted(sent, reverse=True)
    assert len((await sender.jobs.list(limit=1000)).jobs) == 30


async def test_get_shows_every_field_and_the_last_error(pool: asyncpg.Pool, sender: Sender) -> None:
    """``get`` returns the job with its data and last failure text; an unknown id is None."""
    ids = await one_of_each(pool, sender)
    job = await sender.jobs.get(ids["failed"])
    assert job is not None
    assert (job.queue, job.state, job.data, job.error, job.attempt) == (
        "q",
        "failed",
        {"s": "failed"},
        "boom",
        1,
    )
    assert job.as_json(show_data=False)["data"] == {
        "redacted": True,
        "bytes": len('{"s": "failed"}'),
    }
    assert await sender.jobs.get(2**62) is None


@pytest.mark.parametrize(
    "call",
    [
        lambda jobs: jobs.retry([]),
        lambda jobs: jobs.retry("12"),
        lambda jobs: jobs.cancel([0]),
        lambda jobs: jobs.list(state="done"),
        lambda jobs: jobs.list(limit=0),
        lambda jobs: jobs.list(after="abc"),
        lambda jobs: jobs.retry_where(queue="q", since=datetime(2024, 1, 1)),
    ],
)
async def test_bad_arguments_are_refused_before_the_database(sender: Sender, call) -> None:
    """Invalid ids, states, limits, cursors and naive datetimes raise InvalidArgument."""
    with pytest.raises(InvalidArgument):
        await call(sender.jobs)


async def test_a_late_outcome_of_a_cancelled_job_is_logged_as_cancel_fenced(
    pool: asyncpg.Pool, sender: Sender, captured_logs: list[dict[str, object]]
) -> None:
    """A handler that finishes just after its job was cancelled has its outcome fenced: logged
    job.cancel_fenced (state cancelled, or deleted), never counted as a lost lease."""
    from prometheus_client import REGISTRY

    from worker.queue.completer import Completer
    from worker.queue.holdings import Holdings

    await make_queue(pool, "q")
    store = JobStore(pool, SQL, uuid.uuid4())
    ids = await sender.send_many("q", [{}, {}, {}])
    claimed = await store.claim("q", 3)
    await sender.jobs.cancel(ids[:1])
    await sender.jobs.delete(ids[1:2])
    holdings = Holdings()
    holdings.add(3)
    completer = Completer(store, holdings)
    before = REGISTRY.get_sample_value("jobs_lease_lost_total", {"queue": "q"}) or 0.0
    for job in claimed:
        completer.succeeded(job)
    await completer.drain()
    fenced = [e for e in captured_logs if e["event"] == "job.cancel_fenced"]
    assert sorted((e["job_id"], e["state"]) for e in fenced) == [
        (ids[0], "cancelled"),
        (ids[1], "deleted"),
    ]
    assert not [e for e in captured_logs if e["event"] == "job.lease_lost"]
    after = REGISTRY.get_sample_value("jobs_lease_lost_total", {"queue": "q"}) or 0.0
    assert after == before
    assert holdings.count == 0


async def test_a_filtered_list_of_failed_jobs_reads_its_partial_index(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """Among 50,000 completed jobs, the failed jobs of a queue are listed through job_settled,
    even once the plan cache would use a generic plan (the state is in the statement's text)."""
    import json as json_module

    from api_sender import job_queries

    await make_queue(pool, "q")
    await pool.execute(
        "INSERT INTO jobs.job (queue, state, retry_limit, retry_delay, retry_backoff,"
        " expire_seconds, completed_at) SELECT 'q', CASE WHEN g % 500 = 0 THEN 'failed'"
        " ELSE 'completed' END::jobs.job_state, 0, 0, false, 900, now()"
        " FROM generate_series(1, 50000) g"
    )
    await pool.execute("ANALYZE jobs.job")
    sql = job_queries.list_jobs(True, "failed", False, False).render("jobs")
    async with pool.acquire() as conn:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        statement = await conn.prepare("EXPLAIN (FORMAT JSON) " + sql.text)
        plan = await statement.fetchval(*sql.args({"queue": "q", "limit": 51}))
        await conn.execute("RESET plan_cache_mode")
    text = json_module.dumps(plan)
    assert "job_settled" in text
    assert "Seq Scan" not in text
    assert len((await sender.jobs.list(queue="q", state="failed", limit=1000)).jobs) == 100
