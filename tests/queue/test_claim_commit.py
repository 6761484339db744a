"""A claim commits without waiting for the disk; outcomes wait unless written lazily, and every
later statement waits."""

from __future__ import annotations

import uuid

import asyncpg

from api_sender import Sender, create_pool
from tests.support.queues import make_queue
from worker.db import statements as db
from worker.queue.sql import render
from worker.queue.store import JobStore

SQL = render("jobs")
SETTING = "SELECT current_setting('synchronous_commit')"


async def test_claim_turns_synchronous_commit_off_for_its_own_transaction_only(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """Inside the claim's transaction the commit is asynchronous; the next transaction on the
    same session is synchronous again, so a send that follows a claim is durable."""
    await make_queue(pool, "q")
    await sender.send_many("q", [{} for _ in range(3)])
    owner = uuid.uuid4()
    async with pool.acquire() as conn:
        async with conn.transaction():
            claimed = await db.fetch(conn, SQL.claim, queue="q", limit=2, owner=owner)
            assert len(claimed) == 2
            assert await conn.fetchval(SETTING) == "off"
        assert await conn.fetchval(SETTING) == "on"
        async with conn.transaction():
            await db.fetch(
                conn, SQL.claim, queue="q", limit=5, owner=owner
            )  # one left, then none: still lazy
            assert await conn.fetchval(SETTING) == "off"
        async with conn.transaction():
            await db.fetch(conn, SQL.claim_one_per_key, queue="q", limit=5, owner=owner)
            assert await conn.fetchval(SETTING) == "off"


async def test_a_claim_carrying_outcomes_waits_for_the_disk_unless_told_lazy(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """Complete-and-claim and the completion alone commit synchronously, or lazily when asked
    (``lazy``: the worker keeps the batch until it is flushed, worker.queue.unflushed); the
    session's next transaction is synchronous again either way."""
    await make_queue(pool, "q")
    await sender.send_many("q", [{} for _ in range(8)])
    owner = uuid.uuid4()
    async with pool.acquire() as conn:
        for lazy, expected in ((False, "on"), (True, "off")):
            first = await db.fetch(conn, SQL.claim, queue="q", limit=2, owner=owner)
            fence = {
                "owner": owner,
                "ids": [r["id"] for r in first],
                "attempts": [r["attempt"] for r in first],
                "claims": [r["claim"] for r in first],
            }
            async with conn.transaction():
                rows = await db.fetch(
                    conn, SQL.complete_and_claim, queue="q", limit=1, lazy=lazy, **fence
                )
                assert rows[0]["lost"] == []
                assert await conn.fetchval(SETTING) == expected
            assert await conn.fetchval(SETTING) == "on"
            second = await db.fetch(conn, SQL.claim, queue="q", limit=1, owner=owner)
            async with conn.transaction():
                lost = await db.fetchval(
                    conn,
                    SQL.complete_lost,
                    lazy=lazy,
                    owner=owner,
                    ids=[r["id"] for r in second],
                    attempts=[r["attempt"] for r in second],
                    claims=[r["claim"] for r in second],
                )
                assert lost == []
                assert await conn.fetchval(SETTING) == expected
            assert await conn.fetchval(SETTING) == "on"


async def test_store_claims_leave_pooled_sessions_synchronous(db_url: str, sender: Sender) -> None:
    """Through the store on a one-connection pool, claims (plain and one-per-key, with and
    without jobs) leave that connection committing synchronously."""
    pool = await create_pool(db_url, min_size=1, max_size=1)
    try:
        await make_queue(pool, "plain")
        await make_queue(pool, "keyed", policy="singleton")
        await sender.send_many("plain", [{}, {}])
        await sender.send("keyed", {}, singleton_key="k")
        store = JobStore(pool, SQL, uuid.uuid4())
        assert len(await store.claim("plain", 5)) == 2
        assert await pool.fetchval(SETTING) == "on"
        assert await store.claim("plain", 5) == []
        assert len(await store.claim("keyed", 5, one_per_key=True)) == 1
        assert await pool.fetchval(SETTING) == "on"
    finally:
        await pool.close()
