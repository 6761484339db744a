"""The producer: options, ordering, delays, policies, transactions, NOTIFY, bad input."""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Generator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from api_sender import InvalidJob, QueueNotFound, Sender
from api_sender.operation import Op, Rows, Step, one
from api_sender.query import Query
from tests.support.queues import make_queue
from worker.queue.sql import render
from worker.queue.store import JobStore

SQL = render("jobs")


def store_for(pool: asyncpg.Pool) -> JobStore:
    """A store with a fresh owner id."""
    return JobStore(pool, SQL, uuid.uuid4())


async def test_priority_then_creation_order(pool, sender: Sender) -> None:
    """Higher priority is claimed first; equal priority in the order sent."""
    await make_queue(pool, "q")
    low1 = await sender.send("q", {"n": "low1"})
    high = await sender.send("q", {"n": "high"}, priority=10)
    low2 = await sender.send("q", {"n": "low2"})
    mid = await sender.send("q", {"n": "mid"}, priority=5)
    store = store_for(pool)
    order = [(await store.claim("q", 1))[0].id for _ in range(4)]
    assert order == [high, mid, low1, low2]


async def test_batch_claim_returns_priority_order(pool, sender: Sender) -> None:
    """One claim of several jobs hands them over in priority order."""
    await make_queue(pool, "q")
    ids = [await sender.send("q", {}, priority=p) for p in (1, 3, 2)]
    jobs = await store_for(pool).claim("q", 3)
    assert [j.id for j in jobs] == [ids[1], ids[2], ids[0]]


async def test_start_after_seconds_delays_the_job(pool, sender: Sender) -> None:
    """A job sent with start_after=N is not claimable for N seconds (database clock)."""
    await make_queue(pool, "q")
    job_id = await sender.send("q", {}, start_after=120)
    store = store_for(pool)
    assert await store.claim("q", 1) == []
    wait = await pool.fetchval("SELECT start_after - now() FROM jobs.job WHERE id = $1", job_id)
    assert timedelta(seconds=119) < wait <= timedelta(seconds=120)
    await pool.execute("UPDATE jobs.job SET start_after = now() WHERE id = $1", job_id)
    assert [j.id for j in await store.claim("q", 1)] == [job_id]


async def test_start_after_datetime(pool, sender: Sender) -> None:
    """An aware datetime is an absolute start; a past one is due at once."""
    await make_queue(pool, "q")
    later = datetime.now(UTC) + timedelta(hours=1)
    job_id = await sender.send("q", {}, start_after=later)
    stored = await pool.fetchval("SELECT start_after FROM jobs.job WHERE id = $1", job_id)
    assert abs((stored - later).total_seconds()) < 0.001
    past = await sender.send("q", {}, start_after=datetime.now(UTC) - timedelta(minutes=1))
    assert [j.id for j in await store_for(pool).claim("q", 5)] == [past]


async def test_send_many_is_one_statement_in_order(pool, sender: Sender) -> None:
    """send_many returns the ids in item order and stores each payload."""
    await make_queue(pool, "q")
    ids = await sender.send_many("q", [{"n": i} for i in range(500)])
    assert len(ids) == 500
    assert ids == sorted(ids)
    rows = await pool.fetch("SELECT id, data->>'n' AS n FROM jobs.job ORDER BY id")
    assert [int(r["n"]) for r in rows] == list(range(500))
    assert await sender.send_many("q", []) == []


async def test_unknown_queue_raises_queue_not_found(pool, sender: Sender) -> None:
    """Sending to a queue that is not installed raises QueueNotFound naming it; nothing stored."""
    with pytest.raises(QueueNotFound, match="nope"):
        await sender.send("nope", {})
    with pytest.raises(QueueNotFound):
        await sender.send_many("nope", [{}])
    assert await pool.fetchval("SELECT count(*) FROM jobs.job") == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"data": {"x": math.nan}}, "JSON"),
        ({"data": {1, 2}}, "JSON"),
        ({"start_after": -1}, "non-negative"),
        ({"start_after": datetime(2030, 1, 1)}, "timezone"),
        ({"priority": "high"}, "priority"),
        ({"retry_limit": -1}, "retry_limit"),
        ({"singleton_key": ""}, "singleton_key"),
    ],
)
async def test_bad_input_is_refused_before_any_write(pool, sender: Sender, kwargs, message) -> None:
    """Invalid payloads and options raise InvalidJob naming the problem and store nothing."""
    await make_queue(pool, "q")
    data = kwargs.pop("data", {})
    with pytest.raises(InvalidJob, match=message):
        await sender.send("q", data, **kwargs)
    assert await pool.fetchval("SELECT count(*) FROM jobs.job") == 0


async def test_transactional_enqueue_rolled_back_leaves_no_job(pool, sender: Sender) -> None:
    """A send inside a transaction that rolls back leaves no job and no notification."""
    await make_queue(pool, "q")
    listener = await asyncpg.connect(pool._connect_args[0])  # type: ignore[attr-defined]
    heard: list[str] = []
    await listener.add_listener("chassis_jobs_jobs", lambda *a: heard.append(a[3]))
    try:
        async with pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            await sender.send("q", {"n": 1}, connection=conn)
            await tx.rollback()
        await asyncio.sleep(0.2)
        assert await pool.fetchval("SELECT count(*) FROM jobs.job") == 0
        assert heard == []
    finally:
        await listener.close()


async def test_transactional_enqueue_notifies_on_commit_only(pool, sender: Sender) -> None:
    """The job and its NOTIFY become visible when the caller commits, not before."""
    await make_queue(pool, "q")
    listener = await asyncpg.connect(pool._connect_args[0])  # type: ignore[attr-defined]
    heard = asyncio.Queue[str]()
    await listener.add_listener("chassis_jobs_jobs", lambda *a: heard.put_nowait(a[3]))
    try:
        async with pool.acquire() as conn, conn.transaction():
            job_id = await sender.send("q", {"n": 1}, connection=conn)
            await asyncio.sleep(0.2)
            assert heard.empty()
            assert await store_for(pool).claim("q", 1) == []
        assert await asyncio.wait_for(heard.get(), 1.0) == "q"
        assert [j.id for j in await store_for(pool).claim("q", 1)] == [job_id]
    finally:
        await listener.close()


async def test_delayed_send_notifies_without_a_queue(pool, sender: Sender) -> None:
    """A job not yet due wakes no poller: its NOTIFY has an empty payload (re-read next due)."""
    await make_queue(pool, "q")
    listener = await asyncpg.connect(pool._connect_args[0])  # type: ignore[attr-defined]
    heard: list[str] = []
    await listener.add_listener("chassis_jobs_jobs", lambda *a: heard.append(a[3]))
    try:
        await sender.send("q", {}, start_after=60)
        await sender.send_many("q", [{}, {}], start_after=60)
        await asyncio.sleep(0.2)
        assert heard == ["", ""]
    finally:
        await listener.close()


async def test_large_payload_round_trips(pool, sender: Sender) -> None:
    """A 1 MB payload is stored and claimed intact (NOTIFY never carries the payload)."""
    await make_queue(pool, "q")
    blob = "x" * 1_000_000
    await sender.send("q", {"blob": blob})
    [job] = await store_for(pool).claim("q", 1)
    assert job.data == {"blob": blob}


async def test_sender_connect_owns_its_pool(db_url: str, pool) -> None:
    """Sender.connect opens a pool of its own and closes it on exit."""
    await make_queue(pool, "q")
    async with Sender.connect(db_url) as own:
        assert isinstance(await own.send("q", {}), int)
        inner = own.pool
    assert inner._closed  # type: ignore[attr-defined]


async def test_an_owned_sender_keeps_its_connection_clean_through_errors(db_url: str, pool) -> None:
    """Sender.connect's pool keeps a connection at hand between sends; a database error, an
    atomic operation rolled back and an unknown queue leave it usable, and the pool's other
    users still get it (it goes back to the pool soon after the last send)."""
    await make_queue(pool, "q")
    async with Sender.connect(db_url, min_size=1, max_size=1) as own:
        first = await own.send("q", {"n": 1})
        with pytest.raises(asyncpg.DivisionByZeroError):
            await own.run(one(Query("boom", "SELECT 1 / :zero::int AS x"), {"zero": 0}, list))
        with pytest.raises(QueueNotFound):
            await own.send("missing", {})

        def steps() -> Generator[Step, Rows, None]:
            yield Step(Query("insert", "SELECT {s}.send(:queue) AS id"), {"queue": "q"})
            yield Step(Query("boom", "SELECT 1 / :zero::int AS x"), {"zero": 0})

        with pytest.raises(asyncpg.DivisionByZeroError):
            await own.run(Op(steps(), atomic=True))
        second = await own.send("q", {"n": 2})
        async with own.pool.acquire(timeout=10) as conn:
            assert not conn.is_in_transaction()
            ids = await conn.fetch("SELECT id FROM jobs.job ORDER BY id")
        assert [row["id"] for row in ids] == [first, second]
        assert await own.send("q", {"n": 3}) is not None


async def test_a_send_cancelled_mid_statement_leaves_no_connection_behind(
    db_url: str, pool
) -> None:
    """A send cancelled while its statement waits in the database: its connection is not kept
    for the next send as it is; the statement is cancelled, and the next send on the same
    one-connection pool stores its job."""
    await make_queue(pool, "q")
    async with Sender.connect(db_url, min_size=1, max_size=1) as own:
        await own.send("q", {"n": 0})
        async with pool.acquire() as locker:
            locked = locker.transaction()
            await locked.start()
            await locker.execute("LOCK TABLE jobs.job IN ACCESS EXCLUSIVE MODE")
            task = asyncio.create_task(own.send("q", {"n": 1}))
            for _ in range(500):
                waiting = await locker.fetchval(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
                if waiting:
                    break
                await asyncio.sleep(0.01)
            assert waiting == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await locked.rollback()
        after = await own.send("q", {"n": 2})
        rows = await pool.fetch("SELECT id, data->>'n' AS n FROM jobs.job ORDER BY id")
        assert [row["n"] for row in rows] == ["0", "2"]
        assert rows[-1]["id"] == after


async def test_concurrent_sends_on_an_owned_sender_share_its_connections(db_url: str, pool) -> None:
    """Sends from many tasks at once on Sender.connect's small pool all store their job once:
    a kept connection goes to a task waiting for one (the pool's release), not aside."""
    await make_queue(pool, "q")
    async with Sender.connect(db_url, min_size=1, max_size=2) as own:
        ids = await asyncio.gather(*(own.send("q", {"n": n}) for n in range(60)))
        more = await asyncio.gather(*(own.send("q", {"n": n}) for n in range(60, 80)))
    assert len(set(ids) | set(more)) == 80
    assert await pool.fetchval("SELECT count(*) FROM jobs.job") == 80
