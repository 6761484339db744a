"""Cron across replicas: one job per tick, decided by the database; one catch-up after downtime."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from tests.support.ledger import create_ledger
from tests.support.processes import start_daemon
from worker.queue.cron import latest_slot, next_slot

CRON_ENV = {"TOOL_JOBS": "tests.support.tooljobs:CRON", "TEST_TOOL_CRON": "*/2 * * * * *"}


def test_slots_are_inclusive_of_now_and_follow_the_time_zone() -> None:
    """latest_slot includes a tick equal to now; next_slot is strictly later; CRON_TZ applies."""
    at = datetime(2026, 3, 1, 12, 0, 4, tzinfo=UTC)
    assert latest_slot("*/2 * * * * *", "UTC", at) == at
    assert next_slot("*/2 * * * * *", "UTC", at) == at + timedelta(seconds=2)
    nightly = latest_slot("0 3 * * *", "America/New_York", at)
    assert nightly.astimezone(UTC) == datetime(2026, 3, 1, 8, 0, tzinfo=UTC)


async def cron_jobs(url: str) -> list[datetime]:
    """The slot of every job the cron enqueued, from its 'cron:<slot>' key."""
    conn = await asyncpg.connect(url)
    try:
        keys = await conn.fetch(
            "SELECT singleton_key FROM jobs.job WHERE queue = 'tool-cron' ORDER BY id"
        )
    finally:
        await conn.close()
    return [datetime.fromisoformat(k["singleton_key"].removeprefix("cron:")) for k in keys]


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
async def test_three_replicas_enqueue_one_job_per_tick(db_url: str, tmp_path) -> None:
    """Three replicas, a cron every 2 seconds, over 6+ ticks: one job per tick, none missed.

    (Drill 11 runs a per-second cron under SIGKILLs for longer.)"""
    await create_ledger(db_url)
    daemons = [start_daemon(db_url, tmp_path, name=f"r{i}", env=CRON_ENV) for i in range(3)]
    try:
        for d in daemons:
            await asyncio.to_thread(d.wait_ready, 60)
        while len(set(await cron_jobs(db_url))) < 7:
            await asyncio.sleep(0.5)
    finally:
        for d in daemons:
            d.kill()
    slots = await cron_jobs(db_url)
    assert len(slots) == len(set(slots)), "a tick fired twice"
    first, last = min(slots), max(slots)
    expected = int((last - first).total_seconds() // 2) + 1
    assert len(slots) == expected, "a tick was missed"
    assert len(slots) >= 6
    conn = await asyncpg.connect(db_url)
    try:
        runs = await conn.fetch(
            "SELECT data, key FROM public.ledger WHERE queue = 'tool-cron' AND phase = 'start'"
        )
    finally:
        await conn.close()
    assert runs
    assert all(r["data"] is None for r in runs), "a cron run carries data None"


@pytest.mark.slow
async def test_ticks_missed_while_down_fire_once_at_boot(db_url: str, tmp_path) -> None:
    """Workers down over 3+ ticks, then one boots: exactly one catch-up job for the gap."""
    await create_ledger(db_url)
    first = start_daemon(db_url, tmp_path, name="before", env=CRON_ENV)
    try:
        await asyncio.to_thread(first.wait_ready, 60)
        while len(await cron_jobs(db_url)) < 2:
            await asyncio.sleep(0.2)
    finally:
        first.kill()
    before = await cron_jobs(db_url)
    await asyncio.sleep(7.5)  # at least three 2-second ticks with nobody running
    second = start_daemon(db_url, tmp_path, name="after", env=CRON_ENV)
    try:
        await asyncio.to_thread(second.wait_ready, 60)
        while len(await cron_jobs(db_url)) < len(before) + 1:
            await asyncio.sleep(0.1)
    finally:
        second.kill()
    after = [s for s in await cron_jobs(db_url) if s > max(before)]
    catch_up = min(after)
    missed = (catch_up - max(before)).total_seconds() / 2 - 1
    assert missed >= 3, "the workers were not down over three ticks"
    # Had every missed tick fired, the first new slot would follow the old ones directly.
    assert sorted(after) == [catch_up + timedelta(seconds=2 * i) for i in range(len(after))]


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
async def test_disabled_schedule_keeps_the_queue_and_removes_the_cron(db_url: str, tmp_path):
    """Schedule(enabled=False): after the install the queue exists and has no schedule."""
    on = start_daemon(db_url, tmp_path, name="on", env=CRON_ENV)
    try:
        await asyncio.to_thread(on.wait_ready, 60)
    finally:
        on.kill()
    off = start_daemon(
        db_url, tmp_path, name="off", env={**CRON_ENV, "TEST_TOOL_CRON_ENABLED": "0"}
    )
    try:
        await asyncio.to_thread(off.wait_ready, 60)
    finally:
        off.kill()
    conn = await asyncpg.connect(db_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM jobs.queue WHERE name = 'tool-cron'") == 1
        assert (
            await conn.fetchval("SELECT count(*) FROM jobs.schedule WHERE queue = 'tool-cron'") == 0
        )
    finally:
        await conn.close()
