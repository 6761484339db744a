"""Issue 6: the billing hub hangs; requests time out, batches retry, no poller sticks."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from api_sender import Sender, new_ulid
from tests.drills.helpers import (
    SCALE,
    Fleet,
    Watch,
    create_ledger,
    log_events,
    runs,
    sized,
    wait_for,
)
from tests.support.hub import Hub

#: At most two daemons: runs in the second drill lane, beside the multi-process drills.
pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills-light")]

TOKEN = "drill-ingest-token"
TIMEOUT = 1.0


def post_events(url: str, n: int) -> set[str]:
    """Ingest ``n`` events through the daemon's HTTP API; return their ids."""
    events = [
        {
            "id": new_ulid(),
            "meter": "api.calls",
            "quantity": 1,
            "workspace_id": "w1",
            "occurred_at": "2026-01-01T00:00:00Z",
        }
        for _ in range(n)
    ]
    for start in range(0, n, 1000):
        response = httpx.post(
            url,
            json={"events": events[start : start + 1000]},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=15,
        )
        assert response.status_code == 202, response.text
    return {str(e["id"]) for e in events}


async def test_a_hanging_hub_times_out_retries_and_sticks_no_poller(
    db_url: str, fleet: Fleet, hub: Hub, drill_report
):
    """While the hub hangs past HUB_TIMEOUT_SECONDS, each delivery times out on time and the
    batch retries, round after round; the process stays ready and its other queue keeps
    running jobs at once; when the hub answers again every event arrives."""
    hang = sized(6.0, 60.0)
    events = sized(200, 2000)
    await create_ledger(db_url)
    hub.set(mode="hang", hang_seconds=120.0)
    env = {
        **hub.env(),
        "INGEST_TOKEN": TOKEN,
        "HUB_TIMEOUT_SECONDS": str(TIMEOUT),
        "USAGE_BATCH_SIZE": "50",
        "USAGE_RETRY_LIMIT": "3",
        "USAGE_RETRY_DELAY_SECONDS": "0",
        "USAGE_HELD_DELAY_SECONDS": "1",
    }
    [daemon] = await fleet.start_ready(db_url, env, role="all")
    ids = await asyncio.to_thread(post_events, daemon.url("/v1/usage-events"), events)
    began = time.monotonic()
    pickups = []
    with Watch([daemon], paths=("/readyz",)) as watch:
        async with Sender.connect(db_url, max_size=1) as sender:
            while time.monotonic() - began < hang:
                sent = time.time()
                job_id = await sender.send("drill-work", {})
                assert job_id is not None

                async def ran(job: int = job_id) -> bool:
                    return (await runs(db_url, "drill-work")).done[job] == 1

                await wait_for(ran, 10, "a job of another queue to run", step=0.05)
                pickups.append(time.time() - sent)
                await asyncio.sleep(0.5)
        requests_during = hub.snapshot().requests
        hub.set(mode="ok")
        recovered = await asyncio.to_thread(lambda: _wait_accepted(hub, ids))
    timeouts = [
        e for e in log_events(daemon, "usage.delivery_failed") if "timed out" in str(e["error"])
    ]
    assert timeouts, "no delivery timed out"
    assert requests_during >= 2 * hang / (TIMEOUT + 1.0), f"{requests_during} hub requests"
    assert {s.status for s in watch.of("/readyz")} == {200}
    assert max(pickups) < 1.0, f"other queue's jobs waited up to {max(pickups):.2f}s"
    seen = hub.snapshot()
    assert set(seen.accepted) == ids
    drill_report(
        f"drill 18 hub hangs [{SCALE}: {events} events, hub silent {hang:g}s, HUB_TIMEOUT"
        f" {TIMEOUT:g}s]: {len(timeouts)} deliveries timed out and retried ({requests_during}"
        f" hub requests while it hung), /readyz 200 throughout, jobs of another queue started"
        f" within {max(pickups) * 1000:.0f} ms meanwhile; hub back -> all {len(ids)} events"
        f" accepted {recovered:.1f}s later ({sum(seen.duplicates.values())} duplicates deduped by"
        " the hub); nothing dropped"
    )


def _wait_accepted(hub: Hub, ids: set[str]) -> float:
    began = time.monotonic()
    hub.wait_accepted(ids, timeout=sized(60, 300))
    return time.monotonic() - began
