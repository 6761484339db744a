"""LISTEN_MODE=poll (contract section 12): no LISTEN anywhere, new work found by the probe,
cancels of running jobs found by polling within POLL_INTERVAL_SECONDS + 2 s; a process that
installs refuses to start without DATABASE_DIRECT_URL."""

from __future__ import annotations

import asyncio
import time

import pytest

from api_sender import Sender
from tests.ops.test_operations_live import (
    cancel_interrupted,
    rows,
    start_workers,
    wait_for,
    wait_started,
)
from tests.support.ledger import create_ledger
from tests.support.processes import run_cli, start_daemon

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("processes")]

POLL = 1.0


def poll_env(url: str) -> dict[str, str]:
    """A polling worker whose session-level parts go to ``url``."""
    return {
        "LISTEN_MODE": "poll",
        "DATABASE_DIRECT_URL": url,
        "POLL_INTERVAL_SECONDS": str(POLL),
    }


@pytest.mark.parametrize(
    "args",
    [["run", "--role", "worker"], ["run", "--role", "all"], ["migrate", "--wait", "0"]],
)
def test_poll_mode_without_a_direct_url_exits_2_naming_both(args: list[str]) -> None:
    """worker, all and migrate with LISTEN_MODE=poll and no DATABASE_DIRECT_URL: exit 2, one
    line naming both variables, before any connection is tried."""
    done = run_cli("postgresql://u@127.0.0.1:1/db", *args, env={"LISTEN_MODE": "poll"}, timeout=30)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "DATABASE_DIRECT_URL" in lines[0]
    assert "LISTEN_MODE=poll" in lines[0]


def test_an_invalid_direct_url_exits_2_without_quoting_it() -> None:
    """DATABASE_DIRECT_URL is checked as DATABASE_URL is; the message never quotes it."""
    done = run_cli(
        "postgresql://u@127.0.0.1:1/db",
        "migrate",
        env={"DATABASE_DIRECT_URL": "http://u:hunter2@x/db"},
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    assert "DATABASE_DIRECT_URL" in done.stderr
    assert "hunter2" not in done.stderr


async def test_an_api_in_poll_mode_needs_no_direct_url(db_url: str, tmp_path) -> None:
    """The api role opens no session: it boots with LISTEN_MODE=poll alone."""
    assert run_cli(db_url, "migrate").returncode == 0
    api = start_daemon(db_url, tmp_path, role="api", env={"LISTEN_MODE": "poll"}, name="api")
    try:
        await asyncio.to_thread(api.wait_ready, 60)
    finally:
        assert api.stop() == 0


async def test_a_polling_worker_listens_nowhere_and_finds_work_and_cancels_by_polling(
    db_url: str, tmp_path
) -> None:
    """No listener connection; a send is picked up by the probe; a running job cancelled from
    here is interrupted within POLL_INTERVAL_SECONDS + 2 s, never finishes, stays cancelled;
    resumed, it starts again within the same bound."""
    await create_ledger(db_url)
    [daemon] = await start_workers(db_url, tmp_path, 1, **poll_env(db_url))
    try:
        listeners = await rows(
            db_url,
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'chassis-worker listener'",
        )
        assert listeners == []
        async with Sender.connect(db_url, max_size=2) as sender:
            job_id = await sender.send("tool-work", {"sleep": 60})
            await wait_started(db_url, job_id)
            asked = time.monotonic()
            assert await sender.jobs.cancel([job_id]) == [job_id]
            while not cancel_interrupted(daemon, job_id):
                assert time.monotonic() - asked < POLL + 2.0, "not interrupted in poll + 2 s"
                await asyncio.sleep(0.02)
            phases = await rows(
                db_url, "SELECT phase FROM public.ledger WHERE job_id = $1 ORDER BY seq", job_id
            )
            assert [r["phase"] for r in phases] == ["start"]
            job = await sender.jobs.get(job_id)
            assert job is not None
            assert job.state == "cancelled"

            # Resume: the probe finds it again within the same bound, and it starts over.
            resumed = time.monotonic()
            assert await sender.jobs.resume([job_id]) == [job_id]

            async def restarted() -> bool:
                found = await rows(
                    db_url,
                    "SELECT 1 FROM public.ledger WHERE job_id = $1 AND phase = 'start'",
                    job_id,
                )
                return len(found) == 2

            while not await restarted():
                assert time.monotonic() - resumed < POLL + 2.0, "resumed job not started in time"
                await asyncio.sleep(0.05)
            assert await sender.jobs.cancel([job_id]) == [job_id]

            other = await sender.send("tool-work", {"n": 1})

            async def done(job_id: int) -> bool:
                job = await sender.jobs.get(job_id)
                return job is not None and job.state == "completed"

            await wait_for(lambda: done(other), 15)
    finally:
        assert daemon.stop() == 0
    assert not any(e.get("event") == "job.lease_lost" for e in daemon.events())
    assert not any(str(e.get("event", "")).startswith("listener.") for e in daemon.events())
