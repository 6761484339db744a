"""Cron across replicas: one job per tick, decided by the database; one catch-up after downtime."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from tests.support.ledger import create_ledger
from tests.support.processes import start_daemon
from tests.support.queues import make_queue
from worker.queue.cron import CronScheduler, latest_slot, next_slot, schedule_problem
from worker.queue.sql import render

CRON_ENV = {"TOOL_JOBS": "tests.support.tooljobs:CRON", "TEST_TOOL_CRON": "*/2 * * * * *"}


def test_slots_are_inclusive_of_now_and_follow_the_time_zone() -> None:
    """latest_slot includes a tick equal to now; next_slot is strictly later; CRON_TZ applies."""
    at = datetime(2026, 3, 1, 12, 0, 4, tzinfo=UTC)
    assert latest_slot("*/2 * * * * *", "UTC", at) == at
    assert next_slot("*/2 * * * * *", "UTC", at) == at + timedelta(seconds=2)
    nightly = latest_slot("0 3 * * *", "America/New_York", at)
    assert nightly.astimezone(UTC) == datetime(2026, 3, 1, 8, 0, tzinfo=UTC)


NEW_YORK = "America/New_York"
#: 2025-11-02: at 06:00Z New York's clocks go back from 02:00 EDT to 01:00 EST, so every wall
#: time from 01:00 to 01:59:59 happens twice (05:00-06:00Z and 06:00-07:00Z).
FALL_BACK = datetime(2025, 11, 2, 6, 0, tzinfo=UTC)
#: 2025-03-09: at 07:00Z the clocks jump from 02:00 EST to 03:00 EDT; 02:xx never happens.
SPRING_FORWARD = datetime(2025, 3, 9, 7, 0, tzinfo=UTC)


def ticks(cron: str, tz: str, start: datetime, end: datetime) -> list[datetime]:
    """Every tick of ``cron`` after ``start`` up to ``end``, walked with next_slot, in UTC."""
    found: list[datetime] = []
    at = start
    while (at := next_slot(cron, tz, at)) <= end:
        found.append(at.astimezone(UTC))
    return found


def utc(hour: int, minute: int = 0, second: int = 0, *, day: datetime = FALL_BACK) -> datetime:
    """The UTC instant ``hour:minute:second`` on the day of ``day``."""
    return day.replace(hour=hour, minute=minute, second=second)


def around(day: datetime) -> tuple[datetime, datetime]:
    """From 12 hours before ``day`` to 12 hours after it."""
    return day - timedelta(hours=12), day + timedelta(hours=12)


def assert_latest_agrees(cron: str, tz: str, start: datetime, end: datetime) -> None:
    """latest_slot at every 30 seconds from ``start`` to ``end`` is the newest walked tick."""
    walked = [start - timedelta(days=2), *ticks(cron, tz, start - timedelta(days=2), end)]
    at = start
    while at <= end:
        expected = max(t for t in walked if t <= at)
        assert latest_slot(cron, tz, at).astimezone(UTC) == expected, at
        at += timedelta(seconds=30)


@pytest.mark.parametrize("cron", ["30 1 * * *", "0 30 1 * * *"])
def test_a_fixed_time_in_the_repeated_hour_fires_once_at_its_first_occurrence(cron: str) -> None:
    """On the day clocks go back, a cron at 01:30 (5 fields, or 6 with seconds) ticks once, at
    01:30 EDT, as cron(8) runs fixed-time jobs: the second 01:30 (EST) is no new tick, for
    next_slot, for latest_slot, and so for a catch-up after downtime over the hour."""
    start, end = around(FALL_BACK)
    assert ticks(cron, NEW_YORK, start, end) == [utc(5, 30)]
    assert_latest_agrees(cron, NEW_YORK, start, end)
    # A replica that looks only after the repeated hour still sees the first 01:30 as newest.
    assert latest_slot(cron, NEW_YORK, utc(7, 15)).astimezone(UTC) == utc(5, 30)


def test_seconds_ticks_of_a_repeated_minute_fire_once_each() -> None:
    """A 6-field cron every 20 seconds of 01:30 ticks three times on the fall-back day, all in
    the first 01:30 minute: once per wall-clock tick."""
    start, end = around(FALL_BACK)
    assert ticks("*/20 30 1 * * *", NEW_YORK, start, end) == [
        utc(5, 30, 0),
        utc(5, 30, 20),
        utc(5, 30, 40),
    ]
    assert_latest_agrees("*/20 30 1 * * *", NEW_YORK, utc(5, 29), utc(7, 0))


@pytest.mark.parametrize(
    ("cron", "every"), [("0 * * * *", 60), ("*/30 * * * *", 30), ("0 */20 * * * *", 20)]
)
def test_wildcard_hour_or_minute_crons_keep_every_real_tick_through_the_repeated_hour(
    cron: str, every: int
) -> None:
    """Hourly and minutely crons (a '*' hour or minute field) run every real hour or minute
    through the repeated hour, as cron(8) runs wildcard jobs: no gap, no duplicate instant."""
    start, end = utc(4, 0), utc(8, 0)
    found = ticks(cron, NEW_YORK, start - timedelta(seconds=1), end)
    assert found == [start + timedelta(minutes=every * i) for i in range(len(found))]
    assert found[-1] == end
    assert_latest_agrees(cron, NEW_YORK, start, end)


@pytest.mark.parametrize(
    ("cron", "expected"),
    [
        # 02:30 never happens: it fires once, when the clocks reach 03:00 EDT.
        ("30 2 * * *", [utc(7, 0, day=SPRING_FORWARD)]),
        ("30 1 * * *", [utc(6, 30, day=SPRING_FORWARD)]),
        ("0 30 2 * * *", [utc(7, 0, day=SPRING_FORWARD)]),
    ],
)
def test_a_fixed_time_in_the_skipped_hour_still_fires_once(
    cron: str, expected: list[datetime]
) -> None:
    """On the day clocks go forward a daily cron fires exactly once, even at a wall time that
    never happens that day."""
    start, end = around(SPRING_FORWARD)
    assert ticks(cron, NEW_YORK, start, end) == expected
    assert_latest_agrees(cron, NEW_YORK, start, end)


def test_hourly_cron_skips_no_real_hour_on_spring_forward() -> None:
    """An hourly cron ticks every real hour across the skipped hour (01:00 EST, then 03:00 EDT)."""
    start, end = utc(4, 0, day=SPRING_FORWARD), utc(9, 0, day=SPRING_FORWARD)
    found = ticks("0 * * * *", NEW_YORK, start - timedelta(seconds=1), end)
    assert found == [start + timedelta(hours=i) for i in range(6)]


@pytest.mark.parametrize(
    ("cron", "fired"),
    [
        ("30 1 * * *", ["2025-11-02T05:30:00Z"]),
        (
            "0 * * * *",
            [f"2025-11-02T0{h}:00:00Z" for h in (5, 6, 7, 8)],
        ),
    ],
)
async def test_two_schedulers_walking_the_fall_back_night_fire_each_slot_once(
    pool: asyncpg.Pool, cron: str, fired: list[str]
) -> None:
    """Through FIRE_SCHEDULE on a real database, with last_slot just before the repeated hour,
    two schedulers looking every 5 minutes until after it enqueue 01:30 once, and an hourly cron
    once per real hour."""
    await make_queue(pool, "dst-cron", cron=cron)
    await pool.execute(
        "UPDATE jobs.schedule SET tz = $2, last_slot = $3 WHERE queue = $1",
        "dst-cron",
        NEW_YORK,
        utc(4, 59),
    )
    replicas = [CronScheduler(pool, render("jobs"), ["dst-cron"]) for _ in range(2)]
    at = utc(4, 55)
    while at <= utc(8, 10):
        for replica in replicas:
            await replica.tick(at=at)
        at += timedelta(minutes=5)
    keys = await pool.fetch(
        "SELECT singleton_key FROM jobs.job WHERE queue = 'dst-cron' ORDER BY id"
    )
    assert [k["singleton_key"] for k in keys] == [f"cron:{slot}" for slot in fired]


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
    # At least three 2-second ticks with nobody running, whatever the phase: the last slot
    # before the kill is at most 0.2 s before it (polled above), and the catch-up fires for the
    # newest slot at or before the boot, which rounds down by up to 2 s (7.5 s was not enough
    # when the second worker booted in under 0.4 s).
    await asyncio.sleep(9.5)
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


def test_schedule_problem_accepts_what_the_settings_accept() -> None:
    """The row check takes 6-field crons seconds first, as PURGE_CRON and Schedule do."""
    assert schedule_problem("0 30 1 * * *", "Europe/Berlin") is None
    assert schedule_problem("0 3 * * *", "UTC") is None
    assert schedule_problem("0 3 * * *", "Mars/Olympus") == "unknown time zone"


@pytest.mark.parametrize(
    ("cron", "tz"),
    [
        ("* * *", "UTC"),  # too few fields: croniter's IndexError on the old code
        ("61 * * * *", "UTC"),
        ("not a cron", "UTC"),
        ("*/2 * * * * *", "Nowhere/Atlantis"),
        ("*/2 * * * * *", "../../etc/passwd"),
        ("0 0 30 2 *", "UTC"),  # parses, never ticks
    ],
)
async def test_a_schedule_row_that_does_not_parse_is_logged_once_and_skipped(
    pool: asyncpg.Pool, captured_logs: list[dict[str, object]], cron: str, tz: str
) -> None:
    """A schedule row whose cron or zone does not parse (any role that can write the table may
    write one) neither raises out of a tick nor stops the other schedules firing: it is logged
    once as ``cron.invalid`` with its queue, however many ticks look at it."""
    await make_queue(pool, "bad-cron", cron="* * * * * *")
    await make_queue(pool, "good-cron", cron="* * * * * *")
    await pool.execute(
        "UPDATE jobs.schedule SET cron = $2, tz = $3 WHERE queue = $1", "bad-cron", cron, tz
    )
    scheduler = CronScheduler(pool, render("jobs"), ["bad-cron", "good-cron"])
    for _ in range(3):
        await scheduler.tick()
        await asyncio.sleep(1.05)
    fired = await pool.fetch("SELECT DISTINCT queue FROM jobs.job")
    assert [r["queue"] for r in fired] == ["good-cron"]
    invalid = [e for e in captured_logs if e["event"] == "cron.invalid"]
    assert len(invalid) == 1
    assert invalid[0]["queue"] == "bad-cron"
    assert invalid[0]["cron"] == cron


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
async def test_a_running_worker_survives_an_unparsable_schedule_row(db_url: str, tmp_path) -> None:
    """A worker running a per-second cron keeps running, and keeps firing its other schedules,
    after someone writes an unparsable cron into a schedule row and sends the schedules NOTIFY
    (the old code exited with croniter's IndexError)."""
    await create_ledger(db_url)
    daemon = start_daemon(db_url, tmp_path, name="w", env=CRON_ENV)
    try:
        await asyncio.to_thread(daemon.wait_ready, 60)
        conn = await asyncpg.connect(db_url)
        try:
            await conn.execute(
                "INSERT INTO jobs.queue (name) VALUES ('hostile-cron');"
                "INSERT INTO jobs.schedule (queue, cron) VALUES ('hostile-cron', '* * *')"
            )
            # A cron the daemon knows, made unparsable, so its own scheduler reads it.
            await conn.execute("UPDATE jobs.schedule SET cron = 'x y' WHERE queue = 'tool-cron'")
            await conn.execute("SELECT pg_notify('chassis_schedules_jobs', '')")
            await asyncio.sleep(3)
            assert daemon.process.poll() is None, daemon.logs()
            await conn.execute(
                "UPDATE jobs.schedule SET cron = '* * * * * *' WHERE queue = 'tool-cron'"
            )
            await conn.execute("SELECT pg_notify('chassis_schedules_jobs', '')")
            before = len(await cron_jobs(db_url))
            for _ in range(50):
                if len(await cron_jobs(db_url)) > before:
                    break
                await asyncio.sleep(0.2)
            assert len(await cron_jobs(db_url)) > before, "the mended schedule never fired"
            assert daemon.process.poll() is None, daemon.logs()
        finally:
            await conn.close()
        assert "cron.invalid" in daemon.logs()
    finally:
        daemon.kill()
