"""The producer side of usage: per-item keys in send_many, emit, and the batch enqueue."""

from __future__ import annotations

import socket
import time

import asyncpg
import pytest
from prometheus_client import REGISTRY

from api_sender import (
    USAGE_QUEUE,
    InvalidJob,
    Sender,
    UsageEvent,
    UsageRetry,
    create_pool,
    usage_send_options,
)
from tests.support.processes import free_port
from tests.support.queues import make_queue
from tests.usage.conftest import install_usage, usage_settings


async def test_send_many_gives_each_item_its_own_key(pool: asyncpg.Pool, sender: Sender) -> None:
    """Per-item keys land on their own jobs; None falls back to the shared key."""
    await make_queue(pool, "q")
    ids = await sender.send_many(
        "q", [{"n": 1}, {"n": 2}, {"n": 3}], singleton_key="shared", singleton_keys=["a", None, "c"]
    )
    rows = await pool.fetch("SELECT id, singleton_key FROM jobs.job ORDER BY id")
    assert [r["id"] for r in rows] == ids
    assert [r["singleton_key"] for r in rows] == ["a", "shared", "c"]


async def test_send_many_refuses_a_key_list_of_the_wrong_length(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """A key list that does not match the items is refused before anything is stored."""
    await make_queue(pool, "q")
    with pytest.raises(InvalidJob, match="2 entries for 3 items"):
        await sender.send_many("q", [1, 2, 3], singleton_keys=["a", "b"])
    with pytest.raises(InvalidJob):
        await sender.send_many("q", [1], singleton_keys=[""])
    with pytest.raises(InvalidJob):
        await sender.send_many("q", [1], singleton_keys="a")  # type: ignore[arg-type]
    assert await pool.fetchval("SELECT count(*) FROM jobs.job") == 0


async def test_send_many_keys_respect_queue_policy(pool: asyncpg.Pool, sender: Sender) -> None:
    """On a short queue a per-item key already queued is refused and left out of the ids."""
    await make_queue(pool, "s", policy="short")
    first = await sender.send_many("s", [1, 2], singleton_keys=["k1", "k2"])
    again = await sender.send_many("s", [3, 4], singleton_keys=["k1", "k3"])
    assert len(first) == 2
    assert len(again) == 1


async def test_emit_sends_with_the_usage_options(db_url: str, pool: asyncpg.Pool) -> None:
    """emit stores the event with its id as key, the usage retry budget and backoff."""
    await install_usage(pool, usage_settings(db_url))
    retry = UsageRetry(limit=7, delay_seconds=11, held_delay_seconds=99)
    sender = Sender(pool, usage_retry=retry)
    event = UsageEvent("api.calls", 2, "w1", dimensions={"route": "/x"})
    job_id = await sender.usage.emit(event)
    row = await pool.fetchrow(
        "SELECT queue, singleton_key, retry_limit, retry_delay, retry_backoff, data->>'id' AS id "
        "FROM jobs.job WHERE id = $1",
        job_id,
    )
    assert row is not None
    assert dict(row) == {
        "queue": USAGE_QUEUE,
        "singleton_key": event.id,
        "retry_limit": 7,
        "retry_delay": 11,
        "retry_backoff": True,
        "id": event.id,
    }
    options = usage_send_options(event.id, retry)
    assert (options.retry_limit, options.retry_delay, options.retry_backoff) == (7, 11, True)


async def test_enqueue_is_one_statement_all_or_nothing(db_url: str, pool: asyncpg.Pool) -> None:
    """A batch of 1000 events is stored in one statement, each keyed by its id."""
    await install_usage(pool, usage_settings(db_url))
    sender = Sender(pool)
    events = [UsageEvent("m", i, "w") for i in range(1000)]
    ids = await sender.usage.enqueue(events)
    assert len(ids) == 1000
    keys = await pool.fetch("SELECT singleton_key FROM jobs.job ORDER BY id")
    assert [k["singleton_key"] for k in keys] == [e.id for e in events]


async def test_emit_while_the_database_is_down_returns_and_counts(captured_logs: list) -> None:
    """emit against an unreachable database returns None without raising, logs and counts."""
    pool = await create_pool(
        f"postgresql://postgres@127.0.0.1:{free_port()}/none", min_size=0, max_size=1
    )
    try:
        sender = Sender(pool)
        before = REGISTRY.get_sample_value("usage_emit_failures_total") or 0.0
        event = UsageEvent("api.calls", 1, "w1")
        assert await sender.usage.emit(event) is None
        assert REGISTRY.get_sample_value("usage_emit_failures_total") == before + 1
    finally:
        await pool.close()
    failures = [e for e in captured_logs if e["event"] == "usage.emit_failed"]
    assert failures
    assert failures[0]["event_id"] == event.id
    assert failures[0]["log_level"] == "error"


async def test_emit_on_a_closed_pool_returns_and_counts(db_url: str) -> None:
    """emit after the pool was closed (the app shutting down) still never raises."""
    pool = await create_pool(db_url, min_size=1, max_size=1)
    await pool.close()
    before = REGISTRY.get_sample_value("usage_emit_failures_total") or 0.0
    assert await Sender(pool).usage.emit(UsageEvent("m", 1, "w")) is None
    assert REGISTRY.get_sample_value("usage_emit_failures_total") == before + 1


async def test_emit_of_something_else_returns_and_counts(db_url: str, pool: asyncpg.Pool) -> None:
    """A caller passing a dict instead of a UsageEvent gets None, not an exception."""
    await install_usage(pool, usage_settings(db_url))
    before = REGISTRY.get_sample_value("usage_emit_failures_total") or 0.0
    assert await Sender(pool).usage.emit({"meter": "m"}) is None  # type: ignore[arg-type]
    assert REGISTRY.get_sample_value("usage_emit_failures_total") == before + 1
    assert await pool.fetchval("SELECT count(*) FROM jobs.job") == 0


async def test_emit_against_a_hanging_database_gives_up_in_time() -> None:
    """A database that accepts connections and never answers costs emit its timeout, no more."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections complete in the kernel; nothing ever answers them
        port = silent.getsockname()[1]
        pool = await create_pool(f"postgresql://postgres@127.0.0.1:{port}/x", min_size=0)
        try:
            sender = Sender(pool)
            sender.usage.emit_timeout = 0.5
            before = REGISTRY.get_sample_value("usage_emit_failures_total") or 0.0
            started = time.monotonic()
            assert await sender.usage.emit(UsageEvent("m", 1, "w")) is None
            assert time.monotonic() - started < 2
            assert REGISTRY.get_sample_value("usage_emit_failures_total") == before + 1
        finally:
            pool.terminate()
