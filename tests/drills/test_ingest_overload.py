"""Issue 6: ingest at twice the sustained rate against a real api process, with the database
cut for a moment in the middle."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from api_sender import new_ulid
from tests.drills.helpers import SCALE, Fleet, fetch, sized
from tests.support.dbproxy import DatabaseProxy
from tests.support.processes import run_cli

#: At most two daemons: runs in the second drill lane, beside the multi-process drills.
pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills-light")]

TOKEN = "drill-ingest-token"
BATCH = 100


def rss_kb(pid: int) -> int:
    """Resident set size of ``pid`` in kB (VmRSS of /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


class Client:
    """Posts batches of events and records each answer: (sent at, status, ids)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers: list[tuple[float, int, list[str]]] = []
        self._lock = threading.Lock()
        self._local = threading.local()

    def post(self) -> None:
        """One request of BATCH events."""
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = httpx.Client(timeout=30)
        events = [
            {
                "id": new_ulid(),
                "meter": "api.calls",
                "quantity": 1,
                "workspace_id": "w1",
                "occurred_at": "2026-01-01T00:00:00Z",
            }
            for _ in range(BATCH)
        ]
        sent = time.time()
        try:
            response = client.post(
                self.url, json={"events": events}, headers={"Authorization": f"Bearer {TOKEN}"}
            )
            status = response.status_code
        except httpx.HTTPError:
            status = 0
        ids = [str(e["id"]) for e in events] if status == 202 else []
        with self._lock:
            self.answers.append((sent, status, ids))


def closed_loop(client: Client, seconds: float) -> float:
    """One client posting back to back: the events per second one producer sustains."""
    began = time.monotonic()
    n = 0
    while time.monotonic() - began < seconds:
        client.post()
        n += 1
    return n * BATCH / (time.monotonic() - began)


def open_loop(client: Client, rate: float, seconds: float) -> int:
    """Offer ``rate`` events per second on a fixed schedule, whatever the answers take."""
    interval = BATCH / rate
    began = time.monotonic()
    sent = 0
    with ThreadPoolExecutor(max_workers=16) as pool:
        while time.monotonic() - began < seconds:
            pool.submit(client.post)
            sent += 1
            time.sleep(max(0.0, began + sent * interval - time.monotonic()))
    return sent


async def test_ingest_at_twice_the_sustained_rate_stays_bounded(
    db_url: str, fleet: Fleet, drill_report
):
    """An api process measured at its sustained rate, then offered twice that for a while with
    the database cut for a few seconds in the middle: every answer is 202, or 503 while the
    database is away; its memory stays bounded; every accepted event is in the queue."""
    migrated = await asyncio.to_thread(run_cli, db_url, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    proxy = DatabaseProxy(db_url)
    try:
        [api] = await fleet.start_ready(proxy.url, {"INGEST_TOKEN": TOKEN}, role="api")
        client = Client(api.url("/v1/usage-events"))
        sustained = await asyncio.to_thread(closed_loop, client, sized(3.0, 15.0))
        rate = 2 * sustained
        duration = sized(8.0, 60.0)
        rss: list[tuple[float, int]] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                rss.append((time.time(), rss_kb(api.pid)))
                stop.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        began = time.time()
        load = asyncio.create_task(asyncio.to_thread(open_loop, client, rate, duration))
        await asyncio.sleep(duration / 2)
        cut = time.time()
        proxy.cut()
        await asyncio.sleep(3.0)
        proxy.restore()
        restored = time.time()
        requests = await load
        stop.set()
        sampler.join()
        assert api.process.poll() is None, "the api process died"
    finally:
        proxy.close()
    overload = [a for a in client.answers if a[0] >= began]
    statuses = Counter(status for _, status, _ in overload)
    assert set(statuses) <= {202, 503}, f"answers {dict(statuses)}"
    stray = [
        at for at, status, _ in overload if status == 503 and not cut - 1 <= at <= restored + 10
    ]
    assert not stray, f"{len(stray)} answers 503 while the database was up"
    assert statuses[503] > 0, "the cut never showed: was the api behind the proxy?"
    first = [kb for at, kb in rss if at < began + duration / 2]
    second = [kb for at, kb in rss if at >= began + duration / 2]
    assert max(second) <= max(first) * 1.3 + 10_000, f"RSS grew: {rss}"
    assert max(kb for _, kb in rss) < 400_000
    accepted = [i for _, _, ids in client.answers for i in ids]
    stored = await fetch(
        db_url,
        "SELECT count(*) FROM jobs.job WHERE queue = 'usage-events'"
        " AND singleton_key = ANY($1::text[])",
        accepted,
    )
    assert int(stored[0][0]) == len(accepted), "an accepted event is not in the queue"
    achieved = statuses[202] * BATCH / duration
    refused = [at for at, status, _ in overload if status == 503]
    back = max(refused) - restored
    drill_report(
        f"drill 19 ingest overload [{SCALE}: sustained {sustained:.0f} events/s by one client, then"
        f" {rate:.0f}/s offered for {duration:g}s in batches of {BATCH}, database cut 3s"
        f" midway]: {requests} requests -> {statuses[202]} x 202 ({achieved:.0f} events/s),"
        f" {statuses[503]} x 503 only while cut (the last {back:+.1f}s from the restore), no"
        " other status; RSS"
        f" {min(kb for _, kb in rss) // 1024}-{max(kb for _, kb in rss) // 1024} MB, no growth;"
        f" nothing lost ({len(accepted)}/{len(accepted)} accepted events in the queue)"
    )
