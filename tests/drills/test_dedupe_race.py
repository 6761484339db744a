"""Drill 10: many producers race one singleton key into a ``short`` queue."""

from __future__ import annotations

import asyncio

import pytest

from api_sender import Sender, create_pool
from tests.drills.helpers import SCALE, fetch, sized
from tests.support.queues import make_queue

pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills")]

QUEUE = "drill-short"
RACERS = 50


async def racer(sender: Sender, gate: asyncio.Event, n: int, key: str) -> int | None:
    """Wait for the gate, then send round ``n``'s job with ``key``."""
    await gate.wait()
    return await sender.send(QUEUE, {"round": n}, singleton_key=key)


async def test_fifty_racing_sends_of_one_key_leave_one_row(db_url: str, drill_report) -> None:
    """50 tasks send one singleton key to a ``short`` queue at the same instant, round after
    round: each round stores exactly one job, one send gets its id and the other 49 get None."""
    rounds = sized(20, 200)
    pool = await create_pool(db_url, min_size=16, max_size=16)
    try:
        await make_queue(pool, QUEUE, policy="short")
        sender = Sender(pool)
        for n in range(rounds):
            gate = asyncio.Event()

            tasks = [asyncio.create_task(racer(sender, gate, n, f"key-{n}")) for _ in range(RACERS)]
            await asyncio.sleep(0.01)
            gate.set()
            answers = await asyncio.gather(*tasks)
            ids = [a for a in answers if a is not None]
            assert len(ids) == 1, f"round {n}: {len(ids)} sends got an id"
            assert answers.count(None) == RACERS - 1
        rows = await fetch(
            db_url,
            "SELECT singleton_key, count(*) AS n FROM jobs.job WHERE queue = $1 GROUP BY 1",
            QUEUE,
        )
    finally:
        await pool.close()
    assert len(rows) == rounds
    assert {r["n"] for r in rows} == {1}
    drill_report(
        f"drill 10 dedupe race [{SCALE}: {rounds} rounds of {RACERS} concurrent sends of one key"
        f" over 16 connections]: exactly one row per key, {rounds} ids returned and"
        f" {rounds * (RACERS - 1)} sends answered None"
    )
