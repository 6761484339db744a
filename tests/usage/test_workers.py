"""The usage and held workers' batch logic, in process, on a real database and a real hub."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
import structlog
from prometheus_client import REGISTRY
from pydantic import SecretStr

from api_sender import USAGE_HELD_QUEUE, USAGE_QUEUE, QueueNotFound, Sender, UsageEvent
from tests.support.hub import Hub
from tests.usage.conftest import claim, install_usage, usage_settings
from worker.downstream import HubDownstream
from worker.jobs.usage.deliver import UsageDelivery
from worker.jobs.usage.held import HeldRedrive


def _held(reason: str) -> float:
    return REGISTRY.get_sample_value("usage_events_held_total", {"reason": reason}) or 0.0


def _delivered() -> float:
    return REGISTRY.get_sample_value("usage_events_delivered_total") or 0.0


@pytest.fixture
async def usage_sender(db_url: str, pool: asyncpg.Pool) -> Sender:
    """A sender over a database with the usage queues installed (shrunk retry settings)."""
    settings = usage_settings(db_url)
    await install_usage(pool, settings)
    return Sender(pool, usage_retry=settings.usage_retry)


def _delivery(hub: Hub, sender: Sender) -> UsageDelivery:
    poster = HubDownstream(hub.url, hub.client_id, SecretStr(hub.client_secret), timeout=1.0)
    return UsageDelivery(poster, sender)


async def test_a_poison_event_fails_alone(
    hub: Hub, pool: asyncpg.Pool, usage_sender: Sender
) -> None:
    """A batch with one event the hub refuses: the others are delivered, only it fails."""
    events = [UsageEvent("m", i, "w") for i in range(20)]
    await usage_sender.usage.enqueue(events)
    poison = events[13].id
    hub.set(refuse_ids={poison})
    jobs = await claim(pool, USAGE_QUEUE)
    failures = await _delivery(hub, usage_sender).run_batch(jobs)
    assert failures is not None
    poison_job = next(j.id for j in jobs if j.data["id"] == poison)
    assert list(failures) == [poison_job]
    assert "400" in failures[poison_job]
    assert hub.accepted_ids() == {e.id for e in events} - {poison}
    # Halving costs about two requests per level, not one per event.
    assert hub.snapshot().requests <= 2 * math.ceil(math.log2(20)) + 1


async def test_an_outage_fails_the_whole_batch_in_one_request(
    hub: Hub, pool: asyncpg.Pool, usage_sender: Sender
) -> None:
    """A 503 is not split: every job fails with the hub's answer after a single request."""
    await usage_sender.usage.enqueue([UsageEvent("m", i, "w") for i in range(10)])
    hub.set(mode="fail")
    jobs = await claim(pool, USAGE_QUEUE)
    failures = await _delivery(hub, usage_sender).run_batch(jobs)
    assert failures is not None
    assert set(failures) == {j.id for j in jobs}
    assert all("503" in error for error in failures.values())
    assert hub.snapshot().requests == 1


async def test_window_holds_go_to_the_held_queue_labelled_and_counted_once(
    hub: Hub, pool: asyncpg.Pool, usage_sender: Sender
) -> None:
    """Future-dated events the hub holds are sent to the held queue keyed as window holds."""
    later = datetime.now(UTC) + timedelta(hours=1)
    events = [UsageEvent("m", 1, "w"), UsageEvent("m", 2, "w", occurred_at=later)]
    await usage_sender.usage.enqueue(events)
    held_before, delivered_before = _held("occurred_at_window"), _delivered()
    with structlog.testing.capture_logs() as logs:
        failures = await _delivery(hub, usage_sender).run_batch(await claim(pool, USAGE_QUEUE))
    assert failures is None
    rows = await pool.fetch(
        "SELECT singleton_key, data->>'id' AS id FROM jobs.job WHERE queue = $1", USAGE_HELD_QUEUE
    )
    assert [(r["id"], r["singleton_key"]) for r in rows] == [
        (events[1].id, f"occurred_at_window:{events[1].id}")
    ]
    assert _held("occurred_at_window") == held_before + 1
    assert _delivered() == delivered_before + 1
    held_logs = [e for e in logs if e["event"] == "usage.held"]
    assert held_logs[0]["log_level"] == "warning"
    assert held_logs[0]["ids"] == [events[1].id]
    assert "clock" in held_logs[0]["hint"]


async def test_a_failed_hold_fails_the_batch_and_counts_nothing(
    hub: Hub, pool: asyncpg.Pool, usage_sender: Sender
) -> None:
    """If the held queue refuses the window holds, the batch raises (retried whole), uncounted."""
    later = datetime.now(UTC) + timedelta(hours=1)
    await usage_sender.usage.enqueue([UsageEvent("m", 1, "w", occurred_at=later)])
    jobs = await claim(pool, USAGE_QUEUE)
    await pool.execute("DELETE FROM jobs.queue WHERE name = $1", USAGE_HELD_QUEUE)
    before = _held("occurred_at_window")
    with pytest.raises(QueueNotFound):
        await _delivery(hub, usage_sender).run_batch(jobs)
    assert _held("occurred_at_window") == before


async def test_a_job_without_an_event_fails_alone(
    hub: Hub, pool: asyncpg.Pool, usage_sender: Sender
) -> None:
    """Data that is not a usage event is never posted; it fails, the real events go through."""
    event = UsageEvent("m", 1, "w")
    await usage_sender.usage.enqueue([event])
    await usage_sender.send(USAGE_QUEUE, {"meter": "no id"})
    jobs = await claim(pool, USAGE_QUEUE)
    failures = await _delivery(hub, usage_sender).run_batch(jobs)
    bad = next(j.id for j in jobs if "id" not in j.data)
    assert failures == {bad: "not a usage event: the job's data has no string id"}
    assert hub.accepted_ids() == {event.id}


async def test_held_redrive_resends_every_event_and_counts_budget_holds_only(
    db_url: str, pool: asyncpg.Pool, usage_sender: Sender
) -> None:
    """Held jobs of both kinds are re-sent with the usage options after the hold; only the
    retry-budget ones are logged at error and counted."""
    budget = [UsageEvent("m", i, "w").to_job_data() for i in range(2)]
    window = UsageEvent("m", 9, "w").to_job_data()
    await usage_sender.send_many(USAGE_HELD_QUEUE, budget)
    await usage_sender.send(
        USAGE_HELD_QUEUE, window, singleton_key=f"occurred_at_window:{window['id']}"
    )
    before_budget, before_window = _held("retry_budget"), _held("occurred_at_window")
    settings = usage_settings(db_url, usage_held_delay_seconds=120)
    with structlog.testing.capture_logs() as logs:
        result = await HeldRedrive(usage_sender, settings.usage_retry).run_batch(
            await claim(pool, USAGE_HELD_QUEUE)
        )
    assert result is None
    rows = await pool.fetch(
        "SELECT singleton_key, data->>'id' AS id, retry_limit, retry_backoff, "
        "extract(epoch FROM start_after - now()) AS wait FROM jobs.job WHERE queue = $1",
        USAGE_QUEUE,
    )
    assert {r["id"] for r in rows} == {budget[0]["id"], budget[1]["id"], window["id"]}
    assert all(r["singleton_key"] == r["id"] for r in rows)
    assert all((r["retry_limit"], r["retry_backoff"]) == (1, True) for r in rows)
    assert all(110 < float(r["wait"]) <= 120 for r in rows)
    assert _held("retry_budget") == before_budget + 2
    assert _held("occurred_at_window") == before_window
    errors = [e for e in logs if e["event"] == "usage.held"]
    assert len(errors) == 1
    assert errors[0]["log_level"] == "error"
    assert sorted(errors[0]["ids"]) == sorted(e["id"] for e in budget)
    assert "HUB_CLIENT_ID" in errors[0]["hint"]


async def test_a_failed_redrive_counts_nothing(pool: asyncpg.Pool, usage_sender: Sender) -> None:
    """A re-send the database refuses raises (the held job retries) and is not counted."""
    await usage_sender.send(USAGE_HELD_QUEUE, UsageEvent("m", 1, "w").to_job_data())
    jobs = await claim(pool, USAGE_HELD_QUEUE)
    await pool.execute("UPDATE jobs.queue SET dead_letter = NULL WHERE name = $1", USAGE_QUEUE)
    await pool.execute("DELETE FROM jobs.queue WHERE name = $1", USAGE_QUEUE)
    before = _held("retry_budget")
    with pytest.raises(QueueNotFound):
        await HeldRedrive(usage_sender, usage_sender.usage.retry).run_batch(jobs)
    assert _held("retry_budget") == before
