"""Completions committed lazily are kept until their flush is seen, and written again when the
server's session ended before that (worker.queue.unflushed).

A crash of the shared server cannot be staged here; the commit a crash would undo is undone by
hand (the job put back to active under its claim, as recovery would leave it) and the session
ended with pg_terminate_backend, as a crash ends it. tests/drills/test_server_crash.py crashes
a server of its own for real.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import anyio
import asyncpg
import pytest

from api_sender import Sender
from tests.support.queues import make_queue
from worker.queue.jobs import ClaimedJob, claim_token
from worker.queue.sql import render
from worker.queue.store import Fence, JobStore, PackedFence
from worker.queue.unflushed import FRESH_FOR, UnflushedCompletions, _record_end

SQL = render("jobs")

UNDO = """
UPDATE jobs.job SET state = 'active', completed_at = NULL WHERE id = ANY($1)
"""
WATCH_PIDS = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND query LIKE '%wal_position%'
"""


@pytest.fixture
async def store(pool: asyncpg.Pool) -> JobStore:
    await make_queue(pool, "q")
    return JobStore(pool, SQL, uuid.uuid4())


@contextlib.asynccontextmanager
async def _watching(
    db_url: str, store: JobStore, interval: float
) -> AsyncIterator[UnflushedCompletions]:
    unflushed = UnflushedCompletions(db_url, store, check_interval=interval)
    async with anyio.create_task_group() as tg:
        tg.start_soon(unflushed.run)
        with anyio.fail_after(10):
            while not unflushed.session():
                await anyio.sleep(0.01)
        yield unflushed
        tg.cancel_scope.cancel()


async def _complete_lazily(
    store: JobStore, unflushed: UnflushedCompletions, jobs: list[ClaimedJob]
) -> None:
    session = unflushed.session()
    assert session
    assert await store.complete_lost(jobs, lazy=True) == set()
    unflushed.written(session, jobs)


async def _states(pool: asyncpg.Pool, ids: list[int]) -> list[str]:
    rows = await pool.fetch("SELECT state::text FROM jobs.job WHERE id = ANY($1)", ids)
    return [row["state"] for row in rows]


async def test_a_batch_is_kept_until_its_flush_is_seen_then_forgotten(
    db_url: str, pool: asyncpg.Pool, sender: Sender, store: JobStore, captured_logs
) -> None:
    """A lazily written batch waits until the watch has seen the WAL flushed past it, then it
    is gone; nothing is written again while the session lives."""
    await sender.send_many("q", [{} for _ in range(5)])
    jobs = await store.claim("q", 5)
    async with _watching(db_url, store, interval=0.05) as unflushed:
        await _complete_lazily(store, unflushed, jobs)
        assert len(unflushed) == 5
        assert await unflushed.settled(10.0)
        assert len(unflushed) == 0
    assert await _states(pool, [j.id for j in jobs]) == ["completed"] * 5
    assert not [e for e in captured_logs if e["event"] == "job.completions_written_again"]


async def test_completions_a_crash_undid_are_written_again_after_the_session_ends(
    db_url: str, pool: asyncpg.Pool, sender: Sender, store: JobStore, captured_logs
) -> None:
    """The commit undone and the watch session ended before its flush was seen: the batch is
    written again on the next session, the undone jobs are completed, and a job completed
    meanwhile by nobody else is left alone (a second write of a written completion matches
    nothing)."""
    await sender.send_many("q", [{} for _ in range(4)])
    jobs = await store.claim("q", 4)
    ids = [j.id for j in jobs]
    async with _watching(db_url, store, interval=0.5) as unflushed:
        await _complete_lazily(store, unflushed, jobs)
        # As recovery from a crash leaves them: active again under their claim (two of four).
        await pool.execute(UNDO, ids[:2])
        [pid] = [row["pid"] for row in await pool.fetch(WATCH_PIDS)]
        assert await pool.fetchval("SELECT pg_terminate_backend($1)", pid)
        assert await unflushed.settled(10.0)
    assert await _states(pool, ids) == ["completed"] * 4
    # Written again once or twice (at the session's loss through the pool, then under the new
    # session): every write covers the four, and two of them were restored.
    again = [e for e in captured_logs if e["event"] == "job.completions_written_again"]
    assert again
    assert all(e["jobs"] == 4 for e in again)
    assert sum(e["restored"] for e in again) == 2


async def test_while_no_watch_session_is_open_completions_wait_for_the_disk(
    store: JobStore,
) -> None:
    """Before the watch connects (and after it lost its session) there is no session to write
    lazily under: the completer writes synchronously."""
    unflushed = UnflushedCompletions("postgresql://127.0.0.1:1/nothing", store)
    assert unflushed.session() == 0
    unflushed.written(0, [])
    assert len(unflushed) == 0


async def test_a_watch_that_stops_answering_turns_lazy_writes_off(
    db_url: str, sender: Sender, store: JobStore
) -> None:
    """While batches wait and the watch has not answered for FRESH_FOR seconds, the next
    completions are written waiting for the disk (session 0) instead of piling up unconfirmed."""
    await sender.send_many("q", [{}])
    jobs = await store.claim("q", 1)
    async with _watching(db_url, store, interval=30.0) as unflushed:
        await _complete_lazily(store, unflushed, jobs)
        await anyio.sleep(FRESH_FOR + 0.2)
        assert unflushed.session() == 0


def test_a_cover_just_past_a_page_header_is_the_page_start() -> None:
    """pg_current_wal_insert_lsn() reads past the header of a page no record has entered yet,
    while the flush stops at the page's first byte: the cover steps back over the header."""
    page = 8192 * 1000
    assert _record_end(page + 24) == page
    assert _record_end(page + 40) == page
    assert _record_end(page + 41) == page + 41
    assert _record_end(page) == page


def test_a_kept_fence_unpacks_to_the_fence_it_was() -> None:
    """A batch is kept packed (machine integers, tokens end to end) and written again from its
    unpacked fence: the same ids, attempts and claim tokens, by position."""
    claims = [claim_token(datetime(2026, 12, 3, 13, 0, s, tzinfo=UTC)) for s in range(3)]
    fence = Fence([3, 2**62, 7], [1, 2, 3], claims)
    packed = PackedFence.of(fence)
    assert len(packed) == 3
    assert isinstance(packed.claims, bytes)
    assert packed.unpacked() == fence
    assert PackedFence.of(Fence([], [], [])).unpacked() == Fence([], [], [])


def test_a_token_of_another_length_is_kept_as_it_is() -> None:
    """Tokens are 8 bytes (timestamptz_send); one that is not is never split at the wrong place."""
    fence = Fence([1, 2], [1, 1], [b"\x00" * 9, b"\x01" * 7])
    packed = PackedFence.of(fence)
    assert packed.claims == fence.claims
    assert packed.unpacked() == fence
