"""``chassis-worker held list|redrive|discard`` against a real database, through the real CLI."""

from __future__ import annotations

import asyncio
import getpass
import json
import subprocess
from dataclasses import dataclass

import asyncpg
import pytest

from api_sender import USAGE_HELD_QUEUE, USAGE_QUEUE, Sender, UsageEvent
from tests.support.processes import run_cli
from tests.usage.conftest import install_usage, usage_settings


@dataclass
class Held:
    """One event in each held state, and one that is not held."""

    waiting: str
    budget: str
    window: str
    fresh: str


@pytest.fixture
async def held(db_url: str, pool: asyncpg.Pool) -> Held:
    """A re-sent event waiting its round, a retry-budget hold, a window hold, a fresh event."""
    settings = usage_settings(db_url)
    await install_usage(pool, settings)
    sender = Sender(pool, usage_retry=settings.usage_retry)
    waiting, budget, window, fresh = (UsageEvent("m", i, "w") for i in range(4))
    await sender.usage.resend([waiting.to_job_data()], start_after=3600)
    await sender.send(USAGE_HELD_QUEUE, budget.to_job_data())
    await sender.send(
        USAGE_HELD_QUEUE, window.to_job_data(), singleton_key=f"occurred_at_window:{window.id}"
    )
    await sender.usage.emit(fresh)
    return Held(waiting.id, budget.id, window.id, fresh.id)


async def _cli(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run_cli, db_url, "held", *args)


async def _jobs(pool: asyncpg.Pool, event_id: str) -> list[tuple[str, str, bool]]:
    rows = await pool.fetch(
        "SELECT queue, state::text AS state, start_after <= now() AS due FROM jobs.job "
        "WHERE data->>'id' = $1 ORDER BY id",
        event_id,
    )
    return [(r["queue"], r["state"], r["due"]) for r in rows]


async def test_list_shows_every_held_event_and_nothing_else(db_url: str, held: Held) -> None:
    """held list --json names the waiting and both held kinds with reasons; the fresh one not."""
    result = await _cli(db_url, "list", "--json")
    assert result.returncode == 0, result.stderr
    listing = json.loads(result.stdout)
    rows = {row["id"]: row for row in listing["held"]}
    assert set(rows) == {held.waiting, held.budget, held.window}
    assert listing["count"] == 3
    assert rows[held.waiting]["status"] == "waiting"
    assert rows[held.budget]["reason"] == "retry_budget"
    assert rows[held.window]["reason"] == "occurred_at_window"
    assert rows[held.budget]["meter"] == "m"
    table = await _cli(db_url, "list")
    assert held.waiting in table.stdout
    assert "3 held event(s)" in table.stdout


async def test_redrive_makes_named_events_due_now(
    db_url: str, pool: asyncpg.Pool, held: Held
) -> None:
    """redrive ID...: a waiting event is due now; a held-queue event is back on the usage queue
    due now (its held job settled); others are untouched; one audit row records it."""
    result = await _cli(db_url, "redrive", held.waiting, held.budget.lower())
    assert result.returncode == 0, result.stderr
    assert "redriven 2 event(s)" in result.stdout
    assert await _jobs(pool, held.waiting) == [(USAGE_QUEUE, "created", True)]
    assert await _jobs(pool, held.budget) == [
        (USAGE_HELD_QUEUE, "completed", True),
        (USAGE_QUEUE, "created", True),
    ]
    assert await _jobs(pool, held.window) == [(USAGE_HELD_QUEUE, "created", True)]
    key = await pool.fetchval(
        "SELECT singleton_key FROM jobs.job WHERE queue = $1 AND data->>'id' = $2",
        USAGE_QUEUE,
        held.budget,
    )
    assert key == held.budget
    [row] = await pool.fetch("SELECT actor_via, action, metadata::text AS m FROM public.audit_log")
    assert (row["actor_via"], row["action"]) == ("cli", "usage.redrive")
    assert json.loads(row["m"]) == {"ids": sorted([held.waiting, held.budget]), "count": 2}


async def test_redrive_all_and_unknown_ids(db_url: str, pool: asyncpg.Pool, held: Held) -> None:
    """redrive --all takes every held event; an id that is not held exits 1 naming it."""
    unknown = await _cli(db_url, "redrive", held.fresh)
    assert unknown.returncode == 1
    assert held.fresh in unknown.stderr
    everything = await _cli(db_url, "redrive", "--all")
    assert everything.returncode == 0, everything.stderr
    assert "redriven 3 event(s)" in everything.stdout
    listing = json.loads((await _cli(db_url, "list", "--json")).stdout)
    assert listing["held"] == []


@pytest.mark.parametrize("args", [("redrive",), ("redrive", "--all", "01ARZ3NDEKTSV4RRFFQ69G5FAV")])
async def test_redrive_needs_ids_or_all(db_url: str, held: Held, args: tuple[str, ...]) -> None:
    """redrive with neither ids nor --all, or with both, is a usage error (exit 2)."""
    result = await _cli(db_url, *args)
    assert result.returncode == 2
    assert "--all" in result.stderr


async def test_discard_refuses_without_yes(db_url: str, pool: asyncpg.Pool, held: Held) -> None:
    """discard without --yes exits 2 and changes nothing."""
    result = await _cli(db_url, "discard", held.budget)
    assert result.returncode == 2
    assert "--yes" in result.stderr
    assert await _jobs(pool, held.budget) == [(USAGE_HELD_QUEUE, "created", True)]
    assert await pool.fetchval("SELECT count(*) FROM public.audit_log") == 0


async def test_discard_cancels_and_writes_one_audit_row(
    db_url: str, pool: asyncpg.Pool, held: Held
) -> None:
    """discard --yes cancels the named held events and records who, which ids and when."""
    result = await _cli(db_url, "discard", held.waiting, held.window, "--yes")
    assert result.returncode == 0, result.stderr
    assert await _jobs(pool, held.waiting) == [(USAGE_QUEUE, "cancelled", False)]
    assert await _jobs(pool, held.window) == [(USAGE_HELD_QUEUE, "cancelled", True)]
    assert await _jobs(pool, held.budget) == [(USAGE_HELD_QUEUE, "created", True)]
    rows = await pool.fetch(
        "SELECT workspace_id, actor_via, principal, action, resource_type, resource_id, "
        "metadata::text AS metadata, now() - created_at < interval '1 minute' AS recent "
        "FROM public.audit_log"
    )
    assert len(rows) == 1
    row = dict(rows[0])
    assert json.loads(row.pop("metadata")) == {
        "ids": sorted([held.waiting, held.window]),
        "count": 2,
    }
    assert row == {
        "workspace_id": None,
        "actor_via": "cli",
        "principal": getpass.getuser(),
        "action": "usage.discard",
        "resource_type": "usage_event",
        "resource_id": None,
        "recent": True,
    }


async def test_discard_of_nothing_held_is_recorded_with_count_zero(
    db_url: str, pool: asyncpg.Pool, held: Held
) -> None:
    """Discarding an event that is not held (a fresh one) changes nothing and exits 1; the
    attempt is still recorded, with a count of 0."""
    result = await _cli(db_url, "discard", held.fresh, "--yes")
    assert result.returncode == 1
    assert await _jobs(pool, held.fresh) == [(USAGE_QUEUE, "created", True)]
    rows = await pool.fetch("SELECT action, metadata::text AS m FROM public.audit_log")
    assert [(r["action"], json.loads(r["m"])["count"]) for r in rows] == [("usage.discard", 0)]


async def test_a_held_job_without_an_event_id_is_named_by_job(
    db_url: str, pool: asyncpg.Pool, held: Held
) -> None:
    """Held data with no event id is listed as job:<id> and can be discarded by that name."""
    job_id = await Sender(pool).send(USAGE_HELD_QUEUE, {"meter": "no id"})
    listing = json.loads((await _cli(db_url, "list", "--json")).stdout)
    assert f"job:{job_id}" in {row["id"] for row in listing["held"]}
    result = await _cli(db_url, "discard", f"job:{job_id}", "--yes")
    assert result.returncode == 0, result.stderr
    state = await pool.fetchval("SELECT state::text FROM jobs.job WHERE id = $1", job_id)
    assert state == "cancelled"


async def test_list_limit_shows_the_first_and_counts_all(db_url: str, held: Held) -> None:
    """--limit cuts the listing, next due first, while the count still covers every held event."""
    listing = json.loads((await _cli(db_url, "list", "--json", "--limit", "2")).stdout)
    assert len(listing["held"]) == 2
    assert listing["count"] == 3
    assert held.waiting not in {row["id"] for row in listing["held"]}  # due last, in an hour
    table = await _cli(db_url, "list", "--limit", "1")
    assert "3 held event(s) (first 1 shown" in table.stdout
