"""SyncSender (psycopg 3) has the whole producer surface of Sender, with the same errors; every
driver's connection= raises them too; pooled=True makes no named prepared statement."""

from __future__ import annotations

import ast
import asyncio
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from api_sender import (
    USAGE_QUEUE,
    InvalidJob,
    QueueNotFound,
    Sender,
    SyncSender,
    UsageEvent,
)
from tests.producers.stacks import configure_django, need
from tests.support.queues import make_queue

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def queues(pool: asyncpg.Pool) -> None:
    """A work queue ``q``, a short-policy queue ``once`` and the usage queue."""
    await make_queue(pool, "q")
    await make_queue(pool, "once", policy="short")
    await make_queue(pool, USAGE_QUEUE)


@pytest.fixture
def sync_sender(db_url: str, queues: None) -> Iterator[SyncSender]:
    need("psycopg", "psycopg")
    with SyncSender.connect(db_url) as sender:
        yield sender


async def _state(pool: asyncpg.Pool, job_id: int | None) -> str | None:
    state: str | None = await pool.fetchval(
        "SELECT state::text FROM jobs.job WHERE id = $1", job_id
    )
    return state


async def test_sync_sender_sends_with_options_and_refuses_what_sender_refuses(
    pool: asyncpg.Pool, sync_sender: SyncSender
) -> None:
    """send, send_many (per-item keys), options and the policy's refusal as Sender has them;
    an unknown queue is QueueNotFound and invalid input InvalidJob naming the field."""
    job_id = sync_sender.send("q", {"k": 1}, priority=5, start_after=30, retry_limit=2)
    row = await pool.fetchrow(
        "SELECT data, priority, retry_limit, start_after > now() + interval '20 s' AS later"
        " FROM jobs.job WHERE id = $1",
        job_id,
    )
    assert row is not None
    assert (row["data"], row["priority"], row["retry_limit"], row["later"]) == (
        '{"k": 1}',
        5,
        2,
        True,
    )
    ids = sync_sender.send_many("q", [{"n": 1}, {"n": 2}], singleton_keys=["a", None])
    keys = await pool.fetch(
        "SELECT singleton_key FROM jobs.job WHERE id = ANY($1) ORDER BY id", ids
    )
    assert [r["singleton_key"] for r in keys] == ["a", None]
    assert sync_sender.send_many("q", []) == []
    assert sync_sender.send("once", {}, singleton_key="k") is not None
    assert sync_sender.send("once", {}, singleton_key="k") is None
    with pytest.raises(QueueNotFound, match="'nope'"):
        sync_sender.send("nope", {})
    with pytest.raises(QueueNotFound):
        sync_sender.send_many("nope", [{}])
    with pytest.raises(InvalidJob) as bad:
        sync_sender.send("q", {"a": "\x00"})
    assert bad.value.field == "data.a"
    with pytest.raises(InvalidJob) as bad:
        sync_sender.send("q", {}, priority="high")  # type: ignore[typeddict-item]
    assert bad.value.field == "priority"
    assert await pool.fetchval("SELECT count(*) FROM jobs.job") == 4


async def test_sync_sender_usage_timers_jobs_and_queues(
    pool: asyncpg.Pool, sync_sender: SyncSender
) -> None:
    """usage.emit (never raising), keyed timers replacing each other, cancel, and the job and
    queue actions with their audit rows, all through the synchronous sender."""
    event = UsageEvent(meter="api.calls", quantity=1, workspace_id="w1")
    emitted = sync_sender.usage.emit(event)
    assert emitted is not None
    assert await pool.fetchval("SELECT singleton_key FROM jobs.job WHERE id = $1", emitted) == (
        event.id
    )
    assert sync_sender.usage.emit("not an event") is None  # type: ignore[arg-type]

    first = sync_sender.timers.schedule("q", delay_seconds=60, key="t1", data={"n": 1})
    second = sync_sender.timers.schedule("q", delay_seconds=60, key="t1", data={"n": 2})
    assert await _state(pool, first) == "cancelled"
    assert await _state(pool, second) == "created"
    assert sync_sender.timers.cancel("q", "t1") is True
    assert sync_sender.timers.cancel("q", "t1") is False
    with pytest.raises(InvalidJob):
        sync_sender.timers.schedule("q", key="t2")
    with pytest.raises(QueueNotFound):
        sync_sender.timers.schedule("nope", delay_seconds=1, key="t2")

    job_id = sync_sender.send("q", {"x": 1})
    assert job_id is not None
    job = sync_sender.jobs.get(job_id)
    assert job is not None
    assert (job.state, job.data) == ("created", {"x": 1})
    page = sync_sender.jobs.list(queue="q", state="created", limit=1)
    assert [j.id for j in page.jobs] == [job_id]
    assert page.next is None
    assert sync_sender.jobs.cancel([job_id]) == [job_id]
    assert sync_sender.jobs.resume([job_id]) == [job_id]
    assert sync_sender.jobs.cancel_where(queue="q", state="created") == 1
    assert await _state(pool, job_id) == "created"
    assert sync_sender.jobs.cancel_where(queue="q", state="created", dry_run=False) == 1
    assert sync_sender.jobs.retry([job_id]) == [job_id]
    assert sync_sender.jobs.delete([job_id]) == [job_id]
    assert sync_sender.jobs.get(job_id) is None

    assert sync_sender.queues.pause("q") is True
    assert sync_sender.queues.pause("q") is False
    assert sync_sender.queues.resume("q") is True
    sync_sender.send_many("q", [{}, {}])
    assert sync_sender.queues.purge("q") == 2
    with pytest.raises(QueueNotFound):
        sync_sender.queues.pause("nope")
    actions = await pool.fetch(
        "SELECT action FROM public.audit_log WHERE actor_via = 'python' ORDER BY id"
    )
    assert [r["action"] for r in actions] == [
        "job.cancel",
        "job.resume",
        "job.cancel",
        "job.retry",
        "job.delete",
        "queue.pause",
        "queue.pause",
        "queue.resume",
        "queue.purge",
    ]


async def test_sync_sender_over_a_pool_commits_each_operation_from_many_threads(
    pool: asyncpg.Pool, db_url: str, queues: None
) -> None:
    """SyncSender(psycopg_pool.ConnectionPool): eight threads sending at once each commit their
    jobs (the pool's connections are not in autocommit), and keyed timers replace atomically."""
    need("psycopg", "psycopg")
    psycopg_pool = need("psycopg_pool", "psycopg")

    def run() -> list[int]:
        with psycopg_pool.ConnectionPool(db_url, min_size=1, max_size=4) as connections:
            sender = SyncSender(connections)
            with ThreadPoolExecutor(8) as threads:
                ids = list(threads.map(lambda n: sender.send("q", {"n": n}), range(40)))
            timers = [sender.timers.schedule("q", delay_seconds=60, key="t") for _ in range(3)]
        return [*ids, *timers]

    ids = await asyncio.to_thread(run)
    states = [await _state(pool, job_id) for job_id in ids]
    assert states == ["created"] * 40 + ["cancelled", "cancelled", "created"]


def _sync_connections(db_url: str) -> Iterator[tuple[str, Any, Any]]:
    """(name, connection, how to end its transaction) for each synchronous stack."""
    psycopg = need("psycopg", "psycopg")
    sqlalchemy = need("sqlalchemy", "sqlalchemy")
    orm = need("sqlalchemy.orm", "sqlalchemy")
    with psycopg.connect(db_url) as conn:
        yield "psycopg", conn, conn.rollback
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("BEGIN")
        yield "psycopg-autocommit", conn, lambda: conn.execute("ROLLBACK")
    engine = sqlalchemy.create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            yield "sqlalchemy", conn, conn.rollback
        with orm.Session(engine) as session:
            yield "session", session, session.rollback
    finally:
        engine.dispose()
    django = configure_django(db_url)
    from django.db import transaction

    atomic = transaction.atomic()
    atomic.__enter__()
    try:

        def rollback() -> None:
            transaction.set_rollback(True)
            atomic.__exit__(None, None, None)

        yield "django", django, rollback
    finally:
        django.close()


async def test_every_sync_connection_raises_what_sender_raises_and_replaces_timers_atomically(
    sync_sender: SyncSender, db_url: str
) -> None:
    """Through psycopg (in and out of autocommit), SQLAlchemy Core and ORM and Django: an
    unknown queue is QueueNotFound, invalid data InvalidJob, and a keyed timer replaced twice
    in the caller's transaction stays in it (none committed on its own)."""

    def run() -> list[tuple[str, Any, Any]]:
        seen = []
        for name, conn, end in _sync_connections(db_url):
            with pytest.raises(QueueNotFound):
                sync_sender.send("nope", {}, connection=conn)
            with pytest.raises(InvalidJob):
                sync_sender.send("q", {"bad": float("nan")}, connection=conn)
            first = sync_sender.timers.schedule("q", delay_seconds=60, key=name, connection=conn)
            second = sync_sender.timers.schedule("q", delay_seconds=60, key=name, connection=conn)
            assert sync_sender.timers.cancel("q", "other", connection=conn) is False
            # Not committed: the sender's own connection does not see them.
            assert sync_sender.jobs.get(second) is None
            end()
            seen.append((name, sync_sender.jobs.get(first), sync_sender.jobs.get(second)))
        return seen

    # In a thread: Django refuses to run in an event loop's thread.
    seen = await asyncio.to_thread(run)
    # Every stack's transaction was rolled back, with all it held.
    stacks = ["psycopg", "psycopg-autocommit", "sqlalchemy", "session", "django"]
    assert seen == [(name, None, None) for name in stacks]


async def test_every_async_connection_raises_what_sender_raises(
    pool: asyncpg.Pool, sender: Sender, db_url: str, queues: None
) -> None:
    """Through asyncpg, psycopg's AsyncConnection and SQLAlchemy's AsyncConnection and
    AsyncSession: QueueNotFound, InvalidJob, and keyed timer replaces inside the transaction."""
    psycopg = need("psycopg", "psycopg")
    aio = need("sqlalchemy.ext.asyncio", "sqlalchemy")
    engine = aio.create_async_engine(db_url.replace("postgresql://", "postgresql+asyncpg://"))
    states = []
    try:
        async with (
            await psycopg.AsyncConnection.connect(db_url) as pg,
            engine.connect() as sa,
            aio.AsyncSession(engine) as session,
        ):
            raw = await asyncpg.connect(db_url)
            try:
                for name, conn in [("asyncpg", raw), ("psycopg", pg), ("sa", sa), ("s", session)]:
                    tx = raw.transaction() if conn is raw else None
                    if tx is not None:
                        await tx.start()
                    with pytest.raises(QueueNotFound):
                        await sender.send_many("nope", [{}], connection=conn)
                    with pytest.raises(InvalidJob):
                        await sender.send("q", {}, singleton_key="", connection=conn)
                    ids = [
                        await sender.timers.schedule(
                            "q", delay_seconds=60, key=name, connection=conn
                        )
                        for _ in range(2)
                    ]
                    states.append([await _state(pool, i) for i in ids])
                    if tx is not None:
                        await tx.commit()
                    else:
                        await conn.commit()
                    states.append([await _state(pool, i) for i in ids])
            finally:
                await raw.close()
    finally:
        await engine.dispose()
    assert states == [[None, None], ["cancelled", "created"]] * 4


async def test_wrong_connections_are_refused_with_what_is_accepted(
    sender: Sender, sync_sender: SyncSender, db_url: str
) -> None:
    """A sync connection given to Sender, an async one to SyncSender, psycopg2 or anything
    else: a TypeError naming what connection= takes."""
    psycopg = need("psycopg", "psycopg")

    class Psycopg2Connection:
        pass

    Psycopg2Connection.__module__ = "psycopg2.extensions"
    with psycopg.connect(db_url) as conn:
        with pytest.raises(TypeError, match="SyncSender"):
            await sender.send("q", {}, connection=conn)
        with pytest.raises(TypeError, match="psycopg2 is not supported"):
            sync_sender.send("q", {}, connection=Psycopg2Connection())
        with pytest.raises(TypeError, match="asyncpg Connection"):
            await sender.send("q", {}, connection=object())
        with pytest.raises(TypeError, match="asyncpg connection is async"):
            sync_sender.send("q", {}, connection=sender.pool)
        with pytest.raises(TypeError, match="psycopg 3 Connection"):
            SyncSender(sender.pool)  # type: ignore[arg-type]


async def _prepared(conn: asyncpg.Connection) -> int:
    count: int = await conn.fetchval("SELECT count(*) FROM pg_prepared_statements")
    return count


@pytest.mark.parametrize("pooled", [True, False])
async def test_pooled_senders_make_no_named_prepared_statement(
    db_url: str, queues: None, pooled: bool
) -> None:
    """With pooled=True neither sender leaves a named prepared statement on its connection
    after many sends (transaction-mode PgBouncer); without it both do (asyncpg's statement
    cache, psycopg's prepare after 5 executions), so the check can see one."""
    need("psycopg", "psycopg")
    async with Sender.connect(db_url, max_size=1, pooled=pooled) as sender:
        for n in range(8):
            await sender.send("q", {"n": n})
            await sender.send_many("q", [{"n": n}])
            await sender.timers.schedule("q", delay_seconds=60, key="k")
        async with sender.pool.acquire() as conn:
            assert (await _prepared(conn) == 0) is pooled
    with SyncSender.connect(db_url, pooled=pooled) as sync_sender:
        for n in range(8):
            sync_sender.send("q", {"n": n})
            sync_sender.send_many("q", [{"n": n}])
            sync_sender.timers.schedule("q", delay_seconds=60, key="k")
        row = sync_sender.connection.execute("SELECT count(*) FROM pg_prepared_statements")
        count = row.fetchone()
        assert count is not None
        assert (count[0] == 0) is pooled


def test_no_producer_code_calls_prepare() -> None:
    """asyncpg's prepare() always names its statement: no module of api_sender calls it."""
    calls = []
    for path in sorted((ROOT / "api_sender").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "prepare":
                calls.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert calls == []


def test_import_api_sender_needs_only_asyncpg() -> None:
    """With psycopg, SQLAlchemy and Django made unimportable, api_sender imports, a Sender can
    be built, and none of them was imported."""
    code = (
        "import sys\n"
        "for name in ('psycopg', 'psycopg2', 'sqlalchemy', 'django'):\n"
        "    sys.modules[name] = None\n"
        "import api_sender\n"
        "from api_sender import Sender, SyncSender\n"
        "assert Sender and SyncSender\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in"
        " ('psycopg', 'sqlalchemy', 'django') and sys.modules[m] is not None]\n"
        "assert loaded == [], loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
