"""The claim instant travels as ``timestamptz_send`` bytes: the worker's own reading of them
must be the server's, to the microsecond, on either side of PostgreSQL's epoch."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from api_sender import Sender
from tests.support.queues import make_queue
from worker.queue.jobs import claim_instant, claim_token
from worker.queue.sql import render
from worker.queue.store import JobStore

INSTANTS = [
    datetime(2026, 12, 1, 21, 30, 5, 123456, tzinfo=UTC),
    datetime(2000, 1, 1, tzinfo=UTC),
    datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(1970, 1, 1, tzinfo=UTC),
    datetime(2262, 4, 11, 23, 47, 16, 854775, tzinfo=UTC),
]


@pytest.mark.parametrize("instant", INSTANTS, ids=str)
async def test_a_claim_token_is_the_servers_binary_timestamp(
    pool: asyncpg.Pool, instant: datetime
) -> None:
    sent = await pool.fetchval("SELECT timestamptz_send($1::timestamptz)", instant)
    assert claim_token(instant) == sent
    assert claim_instant(sent) == instant
    assert claim_token(instant + timedelta(microseconds=1)) != sent


async def test_a_claimed_job_carries_its_started_at_as_a_token(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    await make_queue(pool, "q")
    job_id = await sender.send("q", {"n": 1})
    store = JobStore(pool, render("jobs"), uuid.uuid4())
    [job] = await store.claim("q", 1)
    started = await pool.fetchval("SELECT started_at FROM jobs.job WHERE id = $1", job_id)
    assert job.started_at == started
    assert job.claim == claim_token(started)
