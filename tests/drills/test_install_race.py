"""Drill 12: ten workers booting at one instant on an empty database, then again with the first
installer SIGKILLed in the middle of its install."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import datetime

import asyncpg
import pytest

from tests.drills.helpers import SCALE, Fleet, fetch, log_events
from tests.support.postgres import create_database, drop_database, with_database
from tests.support.processes import Daemon
from worker.db.migrations import latest_version

pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills")]

WORKERS = 10
#: Small pools: ten processes at once on a server others share.
ENV = {"DATABASE_POOL_SIZE": "2"}
#: The lock migration 0002 takes first thing: held by the drill, it parks the first installer
#: between migration 0001 (committed) and 0002 (open), the middle of its install.
CHASSIS_LOCK = (
    "SELECT pg_advisory_lock(hashtextextended('chassis-worker:public-chassis-tables', 0))"
)


@pytest.fixture
async def second_empty_url(admin_url: str) -> AsyncIterator[str]:
    """Another empty database."""
    name = await create_database(admin_url, None)
    try:
        yield with_database(admin_url, name)
    finally:
        await drop_database(admin_url, name)


def at(event: dict[str, object]) -> datetime:
    """When a log line was written."""
    return datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00"))


async def all_ready(daemons: list[Daemon]) -> float:
    """Wait until every daemon is ready; return the seconds it took."""
    began = time.monotonic()
    await asyncio.gather(*(asyncio.to_thread(d.wait_ready, 30) for d in daemons))
    return time.monotonic() - began


async def check_installed_once(url: str, daemons: list[Daemon], dead: Daemon | None = None) -> None:
    """Each migration applied by one process (``dead`` counts too), each queue written once,
    and no worker started (could claim) before the install that made the schema committed."""
    everyone = [*daemons, *([dead] if dead else [])]
    applied = [(d.pid, e["version"]) for d in everyone for e in log_events(d, "migrate.applied")]
    versions = [v for _, v in applied]
    assert sorted(versions) == sorted(set(versions)), f"a migration applied twice: {applied}"
    rows = await fetch(url, "SELECT version FROM jobs.schema_migration ORDER BY version")
    assert sorted(versions) == [r["version"] for r in rows]
    queues = await fetch(url, "SELECT name, created_at = updated_at AS once FROM jobs.queue")
    assert queues
    assert all(r["once"] for r in queues), "a queue was written by a second install"
    done = min(at(e) for d in daemons for e in log_events(d, "install.done"))
    for daemon in daemons:
        started = log_events(daemon, "worker.started")
        assert started, f"pid {daemon.pid} never started"
        assert at(started[0]) >= done, f"pid {daemon.pid} started before the install committed"
        for bad in ("poller.claim_failed", "boot.failed", "install.retry"):
            assert not log_events(daemon, bad), f"pid {daemon.pid} logged {bad}"


async def test_ten_workers_install_once_even_when_the_installer_dies(
    empty_db_url: str, second_empty_url: str, admin_url: str, fleet: Fleet, drill_report
):
    """Ten workers starting at one instant on an empty database install it once, are all ready
    within 30 s and none starts before the install committed, and the same holds when the first
    installer is SIGKILLed between two migrations (the others finish the install once)."""
    first = [fleet.start(empty_db_url, ENV) for _ in range(WORKERS)]
    race = await all_ready(first)
    assert race < 30
    await check_installed_once(empty_db_url, first)
    for daemon in first:
        daemon.kill()

    blocker = await asyncpg.connect(second_empty_url)
    try:
        await blocker.execute(CHASSIS_LOCK)
        second = [fleet.start(second_empty_url, ENV) for _ in range(WORKERS)]
        deadline = time.monotonic() + 30
        victim = None
        while victim is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            victim = next((d for d in second if log_events(d, "migrate.applied")), None)
        assert victim is not None, "no installer got past migration 0001"
        assert [e["version"] for e in log_events(victim, "migrate.applied")] == [1]
        victim.kill()
        survivors = [d for d in second if d is not victim]
        await asyncio.sleep(0.5)
    finally:
        await blocker.close()  # releases the lock: the install can go on
    released = time.monotonic()
    recovered = await all_ready(survivors)
    assert time.monotonic() - released < 30
    await check_installed_once(second_empty_url, survivors, victim)
    finished = [e["version"] for d in survivors for e in log_events(d, "migrate.applied")]
    assert finished == list(range(2, latest_version() + 1)), f"the survivors applied {finished}"
    drill_report(
        f"drill 12 install race [{SCALE}: {WORKERS} workers at one instant, twice]: empty"
        f" database -> installed once, all ready in {race:.1f}s, none started before the install"
        f" committed; first installer SIGKILLed between migrations 0001 and 0002 -> the other"
        f" {len(survivors)} applied 0002 once and were all ready {recovered:.1f}s after it was"
        " free to go on; nothing installed twice"
    )
