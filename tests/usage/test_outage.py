"""Drill 18, the outage: the hub is down past the retry budget; every event is held, re-driven
round after round, and delivered once the hub is back. Counted once per event per round."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.hub import Hub
from tests.support.processes import Daemon
from tests.usage.conftest import fetch, ingest, log_events, metric, start, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.drill]

HELD_COPIES = """
SELECT count(*) FROM jobs.job WHERE queue = 'usage-events-held' AND singleton_key IS NULL
"""
HELD_PENDING = """
SELECT count(*) FROM jobs.job WHERE queue = 'usage-events-held' AND state <= 'active'
"""


def _send(daemon: Daemon, n: int) -> set[str]:
    ids: set[str] = set()
    for start_at in range(0, n, 1000):
        events = [
            {
                "meter": "api.calls",
                "quantity": i,
                "workspace_id": f"w{i % 7}",
                "occurred_at": "2024-05-01T12:00:00Z",
            }
            for i in range(start_at, min(n, start_at + 1000))
        ]
        response = ingest(daemon, {"events": events})
        assert response.status_code == 202, response.text
        ids.update(response.json()["ids"])
    return ids


def _held_ids(daemon: Daemon) -> set[str]:
    return {
        event_id
        for line in log_events(daemon, "usage.held")
        if line["reason"] == "retry_budget"
        for event_id in line["ids"]
    }


def test_3000_events_survive_an_outage(
    hub: Hub, db_url: str, tmp_path: Path, daemons: list[Daemon]
) -> None:
    """3,000 events sent while the hub answers 503: all held (error log, metric), re-driven, and
    all accepted once it is back; usage_events_held_total equals the dead-letter copies."""
    hub.set(mode="fail")
    daemon = start(daemons, db_url, tmp_path, **hub.env(), USAGE_BATCH_SIZE="50")
    ids = _send(daemon, 3000)
    wait_until(lambda: _held_ids(daemon) >= ids, 120, "every event held for its retry budget")
    assert hub.accepted_ids() == set()
    line = log_events(daemon, "usage.held")[0]
    assert line["level"] == "error"
    assert "HUB_CLIENT_ID/HUB_CLIENT_SECRET" in line["hint"]

    hub.set(mode="ok")
    hub.wait_accepted(ids, timeout=120)
    wait_until(lambda: fetch(db_url, HELD_PENDING)[0][0] == 0, 60, "the held queue to drain")
    copies = fetch(db_url, HELD_COPIES)[0][0]
    counted = metric(daemon, "usage_events_held_total", reason="retry_budget")
    logged = sum(
        len(line["ids"])
        for line in log_events(daemon, "usage.held")
        if line["reason"] == "retry_budget"
    )
    # Every dead-letter copy (one per event per round) counted and logged exactly once.
    assert copies >= 3000
    assert counted == copies
    assert logged == copies
    assert hub.accepted_ids() == ids
    assert metric(daemon, "usage_events_delivered_total") >= 3000
    assert hub.client_secret not in daemon.logs()
