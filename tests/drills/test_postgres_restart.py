"""Drill 5: the PostgreSQL server restarts (fast, then immediate) under load.

This restarts the shared server, so it is marked ``server_restart`` and left out of
``make test``; ``make drills`` runs it.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import time

import pytest

from tests.drills.helpers import (
    SCALE,
    Fleet,
    Load,
    Watch,
    create_ledger,
    fetch,
    log_events,
    runs,
    sized,
    states,
    wait_for,
)

pytestmark = [
    pytest.mark.drill,
    pytest.mark.server_restart,
    pytest.mark.xdist_group("drills"),
]

QUEUE = "drill-work"
#: How soon after the server is back every worker must be ready and working again.
BACK_WITHIN = 10.0


def restart_server(mode: str) -> float:
    """Restart the local cluster in ``mode``; return when it accepts connections again."""
    began = time.monotonic()
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", "15", "main", "restart", "-m", mode],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return time.monotonic() - began


async def test_postgres_restarts_under_load_lose_nothing(db_url: str, fleet: Fleet, drill_report):
    """Fast then immediate restarts of PostgreSQL under a steady load: no worker dies, /metrics
    answers throughout, /readyz goes 503 and comes back, every worker is ready and new jobs
    complete within 10 s of the server's return, and every job sent completes."""
    await create_ledger(db_url)
    daemons = await fleet.start_ready(db_url, count=2)
    pids = [d.pid for d in daemons]
    rng = random.Random(5)
    settle = sized(3.0, 15.0)
    outcomes = []
    in_flight: set[int] = set()
    with Watch(daemons) as watch:
        async with Load(
            db_url, QUEUE, lambda _: {"sleep": round(rng.uniform(0.05, 0.5), 2)}, batch=5, every=0.2
        ) as load:
            for mode in ("fast", "immediate"):
                await asyncio.sleep(settle)
                rows = await fetch(
                    db_url, "SELECT id FROM jobs.job WHERE state = 'active' AND queue = $1", QUEUE
                )
                in_flight |= {r["id"] for r in rows}
                began = time.time()
                took = await asyncio.to_thread(restart_server, mode)
                back = time.time()
                # Jobs claimed between the look above and the shutdown were in flight too.
                rows = await fetch(
                    db_url,
                    "SELECT DISTINCT job_id FROM public.drill_ledger WHERE phase = 'start'"
                    " AND at BETWEEN to_timestamp($1) - interval '2 s' AND to_timestamp($2)",
                    began,
                    back,
                )
                in_flight |= {r["job_id"] for r in rows}
                sent_before = set(load.ids)

                async def working(since: float = back, before: set[int] = sent_before) -> bool:
                    fresh = [i for i, at in load.sent.items() if at >= since and i not in before]
                    if not fresh:
                        return False
                    done = await fetch(
                        db_url,
                        "SELECT count(*) FROM jobs.job WHERE id = ANY($1::bigint[])"
                        " AND state = 'completed'",
                        fresh[:20],
                    )
                    return int(done[0][0]) == len(fresh[:20]) and all(
                        s.status == 200 for s in watch.of("/readyz", since=time.time() - 0.6)
                    )

                recovered = await wait_for(working, 60, f"work after the {mode} restart")
                ready = [
                    min(
                        s.at
                        for s in watch.of("/readyz", since=back)
                        if s.pid == pid and s.status == 200
                    )
                    - back
                    for pid in pids
                ]
                outcomes.append((mode, took, recovered, max(ready)))
                assert recovered < BACK_WITHIN, f"{mode}: work resumed after {recovered:.1f}s"
                assert max(ready) < BACK_WITHIN
                assert [d.process.poll() for d in daemons] == [None, None], "a worker died"
            await asyncio.sleep(sized(2.0, 10.0))
        ids = load.ids

        async def all_done() -> bool:
            return (await states(db_url, QUEUE))["completed"] >= len(ids)

        await wait_for(all_done, 90, "every job to complete")
    assert [d.process.poll() for d in daemons] == [None, None], "a worker died"
    assert [d.pid for d in fleet.running()] == pids
    ledger = await runs(db_url, QUEUE)
    assert ledger.missing(ids) == set()
    duplicated = set(ledger.duplicates)
    assert duplicated <= in_flight, (
        f"duplicates outside the in-flight jobs: {duplicated - in_flight}"
    )
    metrics = watch.of("/metrics")
    failed = [s for s in metrics if s.status != 200]
    assert not failed, f"/metrics failed {len(failed)} of {len(metrics)} times: {failed[:3]}"
    slowest = max(s.seconds for s in metrics)
    not_ready = {s.pid for s in watch.of("/readyz") if s.status == 503}
    assert not_ready == set(pids), "a worker never reported the outage on /readyz"
    for daemon in daemons:
        assert log_events(daemon, "listener.reconnected"), "no listener reconnect logged"
    steps = "; ".join(
        f"{mode}: down+up {took:.1f}s, ready {ready:.1f}s and work flowing {rec:.1f}s after"
        for mode, took, rec, ready in outcomes
    )
    drill_report(
        f"drill 5 PostgreSQL restart [{SCALE}, 2 workers, load 25 jobs/s]: {steps}; no worker"
        f" died (same pids), /metrics answered {len(metrics)}/{len(metrics)} scrapes"
        f" (slowest {slowest:.1f}s), /readyz 503 during each outage; nothing lost"
        f" ({len(ids)}/{len(ids)} completed, {len(duplicated)} duplicates, all among the"
        f" {len(in_flight)} in flight)"
    )
