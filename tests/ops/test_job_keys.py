"""Resume and retry keep each key's promise: one pending timer per (queue, key), one created job
per key on a short or stately queue (issue 28 items 9 and 10), under concurrency too."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import asyncpg
import pytest

from api_sender import InvalidArgument, JobFilter, JobsApi, Sender, SyncSender
from api_sender.driver import AsyncpgDriver
from tests.producers.stacks import need
from tests.support.queues import make_queue
from worker.queue.sql import render
from worker.queue.store import JobStore

SQL = render("jobs")
HOUR = 3600.0


async def states(pool: asyncpg.Pool, *ids: int) -> list[str | None]:
    """The state of each job id (``None`` when the row is gone)."""
    rows = await pool.fetch("SELECT id, state::text AS s FROM jobs.job WHERE id = ANY($1)", ids)
    found = {row["id"]: row["s"] for row in rows}
    return [found.get(i) for i in ids]


async def cancelled_timers(
    sender: Sender, queue: str, key: str, n: int, delay: float = HOUR
) -> list[int]:
    """``n`` timers of one key, every one cancelled (each replace cancels the one before, and
    the last is cancelled by hand), oldest first."""
    ids = [await sender.timers.schedule(queue, delay_seconds=delay, key=key) for _ in range(n)]
    assert await sender.timers.cancel(queue, key)
    return ids


async def pending_per_key(pool: asyncpg.Pool, queue: str) -> dict[str, int]:
    """How many jobs of each key of ``queue`` wait or run (created, retry, active)."""
    rows = await pool.fetch(
        "SELECT singleton_key AS k, count(*) AS n FROM jobs.job WHERE queue = $1"
        " AND state IN ('created', 'retry', 'active') GROUP BY 1",
        queue,
    )
    return {row["k"]: row["n"] for row in rows}


async def test_resume_of_cancelled_timers_of_one_key_resumes_the_newest_only(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """Three cancelled timers of one key: resume moves the newest to created, leaves the older
    two cancelled and counts them as skipped."""
    await make_queue(pool, "t")
    ids = await cancelled_timers(sender, "t", "k", 3)
    result = await sender.jobs.act("resume", ids)
    assert (result.ids, result.changed, result.skipped) == ([ids[-1]], 1, 2)
    assert await states(pool, *ids) == ["cancelled", "cancelled", "created"]


async def test_resume_leaves_a_key_whose_timer_is_pending(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """Timers replaced by a pending one stay cancelled when resumed: the key keeps one timer."""
    await make_queue(pool, "t")
    old = [await sender.timers.schedule("t", delay_seconds=HOUR, key="k") for _ in range(3)]
    result = await sender.jobs.act("resume", old[:2])
    assert (result.ids, result.skipped) == ([], 2)
    assert await sender.jobs.resume(old[:2]) == []
    assert await states(pool, *old) == ["cancelled", "cancelled", "created"]


async def test_resume_where_on_a_timer_queue_resumes_one_per_key_as_its_dry_run_said(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """Every key replaced three times, then cancelled: the dry run counts one job per key (and
    the rest as skipped), the live run changes exactly that many and writes one audit row."""
    await make_queue(pool, "t")
    newest = [(await cancelled_timers(sender, "t", f"k{n}", 3))[-1] for n in range(5)]
    await pool.execute("DELETE FROM public.audit_log")
    dry = await sender.jobs.act_where("resume", _filter("t"), dry_run=True)
    assert (dry.changed, dry.skipped) == (5, 10)
    assert await sender.jobs.resume_where(queue="t") == 5
    assert await sender.jobs.resume_where(queue="t", dry_run=False) == 5
    live = await sender.jobs.act_where("resume", _filter("t"), dry_run=False)
    assert (live.changed, live.skipped) == (0, 10)
    assert await states(pool, *newest) == ["created"] * 5
    assert await pending_per_key(pool, "t") == {f"k{n}": 1 for n in range(5)}
    rows = await pool.fetch("SELECT action, metadata FROM public.audit_log ORDER BY id")
    assert [r["action"] for r in rows] == ["job.resume", "job.resume"]
    assert [_meta(r)["count"] for r in rows] == [5, 0]
    assert [_meta(r)["skipped"] for r in rows] == [10, 10]


@pytest.mark.parametrize("policy", ["short", "stately"])
async def test_resume_of_cancelled_jobs_of_one_singleton_key_resumes_the_newest(
    pool: asyncpg.Pool, sender: Sender, policy: str
) -> None:
    """On a short or stately queue, two cancelled jobs of one key: the newer is created again,
    the older stays cancelled; a key with a created job resumes none."""
    await make_queue(pool, "p", policy=policy)
    ids = []
    for _ in range(2):
        job_id = await sender.send("p", {}, singleton_key="k")
        assert job_id is not None
        ids.append(job_id)
        await sender.jobs.cancel([job_id])
    result = await sender.jobs.act("resume", ids)
    assert (result.ids, result.skipped) == ([ids[1]], 1)
    assert await states(pool, *ids) == ["cancelled", "created"]
    assert (await sender.jobs.act("resume", ids)).skipped == 1
    dry = await sender.jobs.act_where("resume", _filter("p"), dry_run=True)
    assert (dry.changed, dry.skipped) == (0, 1)


async def test_resume_on_a_standard_queue_is_not_limited_by_keys(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """Jobs of one key on a standard queue (no policy index) all resume."""
    await make_queue(pool, "s")
    ids = await sender.send_many("s", [{}, {}, {}], singleton_keys=["k", "k", "k"])
    await sender.jobs.cancel(ids)
    result = await sender.jobs.act("resume", ids)
    assert (result.ids, result.skipped) == (sorted(ids), 0)


async def test_retry_of_a_cancelled_timer_leaves_a_key_whose_timer_is_pending(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """A replaced timer retried beside the pending timer of its key stays cancelled, so a claim
    of the due queue fires one timer of the key, not two."""
    await make_queue(pool, "t")
    replaced = await sender.timers.schedule("t", delay_seconds=0, key="k")
    pending = await sender.timers.schedule("t", delay_seconds=0, key="k")
    result = await sender.jobs.act("retry", [replaced])
    assert (result.ids, result.skipped) == ([], 1)
    assert await sender.jobs.retry_where(queue="t", state="cancelled") == 0
    assert await sender.jobs.retry_where(queue="t", state="cancelled", dry_run=False) == 0
    store = JobStore(pool, SQL, uuid.uuid4())
    fired = await store.claim("t", 10)
    assert [job.id for job in fired] == [pending]


async def test_retry_of_cancelled_timers_of_one_key_retries_the_newest_only(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """With no timer of the key pending, retry brings back the newest cancelled one alone; a
    second retry finds it pending and changes nothing."""
    await make_queue(pool, "t")
    ids = await cancelled_timers(sender, "t", "k", 3, delay=0)
    result = await sender.jobs.act("retry", ids)
    assert (result.ids, result.skipped) == ([ids[-1]], 2)
    assert (await sender.jobs.act("retry", ids)).ids == []
    store = JobStore(pool, SQL, uuid.uuid4())
    assert [job.id for job in await store.claim("t", 10)] == [ids[-1]]


async def test_retry_on_a_short_queue_is_outside_the_queued_limit(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """A failed job of a short queue is retried even when its key has a created job: a job
    waiting for its retry is outside the policy's limit (migration 0001), as in pg-boss."""
    await make_queue(pool, "p", policy="short")
    first = await sender.send("p", {}, singleton_key="k")
    assert first is not None
    await sender.jobs.cancel([first])
    waiting = await sender.send("p", {}, singleton_key="k")
    assert waiting is not None
    result = await sender.jobs.act("retry", [first])
    assert (result.ids, result.skipped) == ([first], 0)
    assert await states(pool, first, waiting) == ["retry", "created"]


async def test_concurrent_resumes_of_overlapping_sets_leave_one_pending_per_key(
    pool: asyncpg.Pool, db_url: str
) -> None:
    """Two senders on their own pools resume at once, one by filter and one by the ids of the
    older jobs of each key (so each would pick another job): no error, and every key ends with
    exactly one waiting job, round after round."""
    await make_queue(pool, "t")
    await make_queue(pool, "p", policy="short")
    a = await asyncpg.create_pool(db_url, min_size=1, max_size=2)
    b = await asyncpg.create_pool(db_url, min_size=1, max_size=2)
    try:
        one, two = Sender(a), Sender(b)
        for round_ in range(6):
            keys = [f"r{round_}k{n}" for n in range(8)]
            older: list[int] = []
            for key in keys:
                older.extend((await cancelled_timers(one, "t", key, 3))[:2])
                for _ in range(3):
                    job_id = await one.send("p", {}, singleton_key=key)
                    assert job_id is not None
                    await one.jobs.cancel([job_id])
                    older.append(job_id)
            first, second = await asyncio.gather(
                one.jobs.act_where("resume", _filter("t"), dry_run=False),
                two.jobs.act("resume", older),
            )
            third, fourth = await asyncio.gather(
                one.jobs.act("resume", older),
                two.jobs.act_where("resume", _filter("p"), dry_run=False),
            )
            changed = first.changed + second.changed + third.changed + fourth.changed
            assert changed == 2 * len(keys), (round_, first, second, third, fourth)
            for queue in ("t", "p"):
                waiting = await pending_per_key(pool, queue)
                assert {k: waiting.get(k) for k in keys} == dict.fromkeys(keys, 1), queue
    finally:
        await a.close()
        await b.close()


async def test_concurrent_retries_and_resumes_keep_one_pending_timer_per_key(
    pool: asyncpg.Pool, db_url: str
) -> None:
    """A retry and a resume of the same cancelled timers at once, while a replace schedules a
    new timer of some keys: nothing raises and no key ends with two pending timers."""
    await make_queue(pool, "t")
    a = await asyncpg.create_pool(db_url, min_size=1, max_size=3)
    b = await asyncpg.create_pool(db_url, min_size=1, max_size=3)
    try:
        one, two = Sender(a), Sender(b)
        for round_ in range(6):
            keys = [f"r{round_}k{n}" for n in range(8)]
            ids: list[int] = []
            for key in keys:
                ids.extend(await cancelled_timers(one, "t", key, 2))
            await asyncio.gather(
                one.jobs.act("retry", ids),
                two.jobs.act("resume", ids),
                one.jobs.act_where("resume", _filter("t"), dry_run=False),
                *(two.timers.schedule("t", delay_seconds=HOUR, key=k) for k in keys[::3]),
            )
            waiting = await pending_per_key(pool, "t")
            assert {k: waiting.get(k) for k in keys} == dict.fromkeys(keys, 1), round_
    finally:
        await a.close()
        await b.close()


async def test_resume_waits_out_a_send_of_its_key_and_skips_it(
    pool: asyncpg.Pool, sender: Sender, db_url: str
) -> None:
    """A send of the key in an open transaction makes resume wait for it; once that send
    commits, the resume leaves the cancelled job alone (skipped) instead of raising."""
    await make_queue(pool, "p", policy="short")
    old = await sender.send("p", {}, singleton_key="k")
    assert old is not None
    await sender.jobs.cancel([old])
    conn = await asyncpg.connect(db_url)
    try:
        tx = conn.transaction()
        await tx.start()
        sent = await sender.send("p", {}, singleton_key="k", connection=conn)
        assert sent is not None
        resume = asyncio.create_task(sender.jobs.act("resume", [old]))
        await _until_waiting(pool, resume)
        await tx.commit()
        result = await resume
    finally:
        await conn.close()
    assert (result.ids, result.skipped) == ([], 1)
    assert await states(pool, old, sent) == ["cancelled", "created"]
    rows = await pool.fetch("SELECT action FROM public.audit_log WHERE action = 'job.resume'")
    assert len(rows) == 1


async def test_a_replace_waits_for_an_open_resume_of_its_key_then_cancels_it(
    pool: asyncpg.Pool, sender: Sender, db_url: str
) -> None:
    """A resume inside a caller's open transaction holds the timer key's lock (the one a
    replace takes): a replace of the key waits for its commit, then cancels the resumed timer
    and is the one pending, instead of failing on job_timer_key."""
    await make_queue(pool, "t")
    [old] = await cancelled_timers(sender, "t", "k", 1)
    conn = await asyncpg.connect(db_url)
    try:
        tx = conn.transaction()
        await tx.start()
        assert await JobsApi(AsyncpgDriver(conn, "jobs")).resume([old]) == [old]
        replace = asyncio.create_task(sender.timers.schedule("t", delay_seconds=HOUR, key="k"))
        await _until_waiting(pool, replace)
        assert not replace.done()
        await tx.commit()
        new = await replace
    finally:
        await conn.close()
    assert await states(pool, old, new) == ["cancelled", "created"]


async def test_an_action_needing_too_many_key_locks_is_refused_whole(
    pool: asyncpg.Pool, sender: Sender, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past MAX_KEY_LOCKS free keys, resume (by ids or filter) and its dry run refuse with
    InvalidArgument naming the limit, change nothing and write no audit row."""
    import api_sender.jobs

    await make_queue(pool, "t")
    ids = [(await cancelled_timers(sender, "t", f"k{n}", 1))[0] for n in range(3)]
    await pool.execute("DELETE FROM public.audit_log")
    monkeypatch.setattr(api_sender.jobs, "MAX_KEY_LOCKS", 2)
    for call in (
        sender.jobs.act("resume", ids),
        sender.jobs.act_where("resume", _filter("t"), dry_run=False),
        sender.jobs.act_where("resume", _filter("t"), dry_run=True),
    ):
        with pytest.raises(InvalidArgument, match="at most 2"):
            await call
    assert await states(pool, *ids) == ["cancelled"] * 3
    assert await pool.fetchval("SELECT count(*) FROM public.audit_log") == 0
    assert await sender.jobs.resume(ids[:2]) == ids[:2]


@pytest.fixture
def sync_sender(db_url: str) -> Iterator[SyncSender]:
    """A psycopg 3 SyncSender on this test's database."""
    need("psycopg", "psycopg")
    with SyncSender.connect(db_url) as sync:
        yield sync


async def test_the_sync_sender_resumes_the_newest_job_of_a_key(
    pool: asyncpg.Pool, sender: Sender, sync_sender: SyncSender
) -> None:
    """SyncSender.jobs runs the same locked resume: the newest cancelled timer, the rest
    skipped."""
    await make_queue(pool, "t")
    ids = await cancelled_timers(sender, "t", "k", 2)
    result = await asyncio.to_thread(sync_sender.jobs.act, "resume", ids)
    assert (result.ids, result.skipped) == ([ids[-1]], 1)
    assert await asyncio.to_thread(sync_sender.jobs.resume_where, queue="t") == 0


def _filter(queue: str) -> JobFilter:
    return JobFilter(queue=queue)


def _meta(row: asyncpg.Record) -> dict[str, object]:
    meta = row["metadata"]
    return json.loads(meta) if isinstance(meta, str) else dict(meta)


async def _until_waiting(pool: asyncpg.Pool, task: asyncio.Task[object]) -> None:
    """Wait until some backend waits on a lock (the resume, blocked by the open send)."""
    for _ in range(200):
        if task.done():
            return
        waiting = await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock'"
        )
        if waiting:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the resume never waited for the open send")


async def test_a_repeatable_read_default_still_keeps_one_pending_timer_per_key(
    pool: asyncpg.Pool, db_url: str
) -> None:
    """On a database whose default isolation is REPEATABLE READ, two retries of two cancelled
    timers of one key at once leave one pending timer: the action's own transaction reads its
    keys again after taking their locks (READ COMMITTED), not in the snapshot taken before."""
    await make_queue(pool, "t")
    name = db_url.rsplit("/", 1)[1].split("?")[0]
    await pool.execute(
        f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = 'repeatable read'"
    )
    a = await asyncpg.create_pool(db_url, min_size=1, max_size=3)
    b = await asyncpg.create_pool(db_url, min_size=1, max_size=3)
    try:
        assert await a.fetchval("SHOW default_transaction_isolation") == "repeatable read"
        one, two = Sender(a), Sender(b)
        for round_ in range(8):
            keys = [f"rr{round_}k{n}" for n in range(8)]
            pairs = [await cancelled_timers(one, "t", key, 2) for key in keys]
            await asyncio.gather(
                one.jobs.act("retry", [old for old, _ in pairs]),
                two.jobs.act("retry", [new for _, new in pairs]),
            )
            waiting = await pending_per_key(pool, "t")
            assert {k: waiting.get(k) for k in keys} == dict.fromkeys(keys, 1), round_
    finally:
        await a.close()
        await b.close()


def test_resume_inside_a_callers_repeatable_read_transaction_is_refused_cleanly(
    db_url: str,
) -> None:
    """A SyncSender over the caller's psycopg connection in a REPEATABLE READ transaction (whose
    snapshot cannot see a lock holder's commit) refuses resume with InvalidArgument naming the
    isolation, changes nothing, and leaves the caller's transaction usable."""
    need("psycopg", "psycopg")
    import psycopg

    async def prepare() -> list[int]:
        pool = await asyncpg.create_pool(db_url, min_size=1, max_size=1)
        try:
            await make_queue(pool, "t")
            return await cancelled_timers(Sender(pool), "t", "k", 2)
        finally:
            await pool.close()

    ids = asyncio.run(prepare())
    with psycopg.connect(db_url) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with conn.transaction():
            assert conn.execute("SELECT count(*) FROM jobs.job").fetchone() == (2,)
            with pytest.raises(InvalidArgument, match="READ COMMITTED"):
                SyncSender(conn).jobs.act("resume", ids)
            assert conn.execute(
                "SELECT count(*) FROM jobs.job WHERE state = 'cancelled'"
            ).fetchone() == (2,)
        with conn.transaction():
            rows = conn.execute("SELECT state::text FROM jobs.job ORDER BY id").fetchall()
    assert rows == [("cancelled",), ("cancelled",)]
