"""Drill 18 and friends with real processes: a worker killed mid-batch, a hanging hub, a wrong
secret, a poison event, and window holds for future-dated events."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from api_sender import new_ulid
from tests.support.hub import Hub
from tests.support.processes import Daemon, run_cli
from tests.usage.conftest import fetch, ingest, log_events, metric, start, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.drill]


def _events(n: int, **extra: object) -> list[dict[str, object]]:
    """``n`` valid events (the ingest requires occurred_at), with ``extra`` fields."""
    base = {"meter": "api.calls", "quantity": 1, "workspace_id": "w1"}
    when = {"occurred_at": "2024-05-01T12:00:00Z"}
    return [{"id": new_ulid(), **base, **when, **extra} for _ in range(n)]


def _send(daemon: Daemon, events: list[dict[str, object]]) -> set[str]:
    for start_at in range(0, len(events), 1000):
        response = ingest(daemon, {"events": events[start_at : start_at + 1000]})
        assert response.status_code == 202, response.text
    return {str(e["id"]) for e in events}


def test_a_worker_killed_mid_batch_loses_nothing(
    hub: Hub, db_url: str, tmp_path: Path, daemons: list[Daemon]
) -> None:
    """SIGKILL while the hub holds a batch: a second worker rescues it; every event arrives,
    duplicates only from the batches in flight."""
    hub.set(answer_delay=3.0)
    env = {**hub.env(), "USAGE_BATCH_SIZE": "50", "USAGE_RETRY_LIMIT": "3"}
    first = start(daemons, db_url, tmp_path, **env)
    ids = _send(first, _events(500))
    assert hub.batch_arrived.wait(30)
    first.kill()
    assert hub.snapshot().requests <= 2  # killed mid-batch: the hub never answered
    hub.set(answer_delay=0.0)
    second = start(daemons, db_url, tmp_path, **env)
    hub.wait_accepted(ids, timeout=90)
    seen = hub.snapshot()
    # At-least-once: only events of the batches in flight at the kill may come twice (whether
    # the hub still records the batch its dead client sent depends on timing, so 0 is fine).
    assert sum(seen.duplicates.values()) <= 2 * 50
    assert set(seen.accepted) == ids
    assert log_events(second, "job.failed") or log_events(second, "usage.delivered")


def test_a_hanging_hub_never_sticks_the_poller(
    hub: Hub, db_url: str, tmp_path: Path, daemons: list[Daemon]
) -> None:
    """A hub that hangs past HUB_TIMEOUT_SECONDS fails the batch on time; the worker stays
    healthy, retries, and delivers everything once the hub answers."""
    hub.set(mode="hang", hang_seconds=20)
    daemon = start(
        daemons, db_url, tmp_path, **hub.env(), HUB_TIMEOUT_SECONDS="1", USAGE_RETRY_LIMIT="5"
    )
    ids = _send(daemon, _events(120))
    wait_until(
        lambda: any("timed out" in e["error"] for e in log_events(daemon, "usage.delivery_failed")),
        30,
        "a timed-out batch",
    )
    assert daemon.get("/readyz")[0] == 200
    hub.set(mode="ok")
    hub.wait_accepted(ids, timeout=60)


def test_a_wrong_secret_holds_then_delivers(
    hub: Hub, db_url: str, tmp_path: Path, daemons: list[Daemon]
) -> None:
    """401 from the hub: batches retry, are held with the credentials hint, the secret never
    logged; fixed at the hub, every event arrives."""
    hub.set(mode="unauthorized")
    daemon = start(daemons, db_url, tmp_path, **hub.env())
    ids = _send(daemon, _events(100))
    wait_until(
        lambda: metric(daemon, "usage_events_held_total", reason="retry_budget") >= 100,
        60,
        "the retry budget to run out",
    )
    assert any("401" in e["error"] for e in log_events(daemon, "usage.delivery_failed"))
    hub.set(mode="ok")
    hub.wait_accepted(ids, timeout=60)
    assert hub.client_secret not in daemon.logs()


def test_a_poison_event_never_blocks_the_others(
    hub: Hub, db_url: str, tmp_path: Path, daemons: list[Daemon]
) -> None:
    """One event the hub always refuses (400): the rest are delivered, it alone is held round
    after round, never dropped, until an operator discards it (with an audit row)."""
    events = _events(200)
    poison = str(events[77]["id"])
    hub.set(refuse_ids={poison})
    # A long hold keeps the poison event waiting between rounds, so the discard finds it.
    daemon = start(
        daemons, db_url, tmp_path, **hub.env(), USAGE_BATCH_SIZE="50", USAGE_HELD_DELAY_SECONDS="60"
    )
    ids = _send(daemon, events)
    hub.wait_accepted(ids - {poison}, timeout=60)
    wait_until(
        lambda: any(poison in e["ids"] for e in log_events(daemon, "usage.held")),
        60,
        "the poison event to be held",
    )
    refused = log_events(daemon, "usage.event_refused")
    assert {e["event_id"] for e in refused} == {poison}

    # Still in the pipeline, waiting (an hour's worth of test time) for its next round: never
    # dropped. Waiting, not on the held queue, so the held worker cannot race the discard.
    def waiting() -> bool:
        listing = json.loads(run_cli(db_url, "held", "list", "--json").stdout)
        return [(r["id"], r["status"]) for r in listing["held"]] == [(poison, "waiting")]

    wait_until(waiting, 30, "the poison event waiting for its next round")
    discard = run_cli(db_url, "held", "discard", poison, "--yes")
    assert discard.returncode == 0, discard.stderr
    assert poison in discard.stdout
    audit = fetch(
        db_url, "SELECT metadata FROM public.audit_log WHERE action = 'usage.held_discard'"
    )
    assert len(audit) == 1
    assert poison in audit[0]["metadata"]
    assert poison not in hub.accepted_ids()
    pending = fetch(
        db_url,
        "SELECT count(*) FROM jobs.job WHERE data->>'id' = $1 AND state <= 'active'",
        poison,
    )
    assert pending[0][0] == 0


def test_future_dated_events_arrive_only_after_their_window(
    hub: Hub, db_url: str, tmp_path: Path, daemons: list[Daemon]
) -> None:
    """Events dated a few seconds ahead are held (warning, metric, labelled held jobs), never
    accepted before their time, and accepted after it."""
    daemon = start(daemons, db_url, tmp_path, **hub.env())
    # Dated from the moment of sending: a slow boot must not let the window pass first.
    soon = datetime.now(UTC) + timedelta(seconds=5)
    future = _events(20, occurred_at=soon.isoformat())
    present = _events(5)
    ids = _send(daemon, future + present)
    hub.wait_accepted(ids, timeout=60)
    seen = hub.snapshot()
    for event in future:
        received = seen.accepted[str(event["id"])]
        assert received.at >= received.occurred_at.timestamp()
        assert seen.held[str(event["id"])] >= 1
    assert all(seen.held[str(e["id"])] == 0 for e in present)
    warnings = log_events(daemon, "usage.held")
    assert {w["level"] for w in warnings} == {"warning"}
    assert {w["reason"] for w in warnings} == {"occurred_at_window"}
    assert "clock" in warnings[0]["hint"]
    assert metric(daemon, "usage_events_held_total", reason="occurred_at_window") >= 20
    assert metric(daemon, "usage_events_held_total", reason="retry_budget") == 0
    keys = fetch(
        db_url,
        "SELECT DISTINCT singleton_key FROM jobs.job WHERE queue = 'usage-events-held'",
    )
    assert {k["singleton_key"].split(":")[0] for k in keys} == {"occurred_at_window"}


def test_an_invalid_event_keeps_its_whole_batch_out(
    hub: Hub, db_url: str, tmp_path: Path, daemons: list[Daemon]
) -> None:
    """A batch refused for one invalid event is never delivered, in part or whole; a later
    valid event is (the sentinel that shows the worker ran)."""
    daemon = start(daemons, db_url, tmp_path, **hub.env())
    batch = _events(10)
    batch[6]["quantity"] = "lots"
    response = ingest(daemon, {"events": batch})
    assert response.status_code == 400
    sentinel = _send(daemon, _events(1))
    hub.wait_accepted(sentinel, timeout=30)
    assert hub.accepted_ids() == sentinel
    stored = fetch(
        db_url,
        "SELECT count(*) FROM jobs.job WHERE data->>'id' = ANY($1::text[])",
        [str(e["id"]) for e in batch],
    )
    assert stored[0][0] == 0
