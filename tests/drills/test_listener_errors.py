"""Drill: a database that cancels the worker's start-up statements (statement_timeout = 1ms on
every new session: the install's, the pool check's, the listener's) keeps the worker up and not
ready, retrying, instead of ending it (issue 28, item 6). Which of them the server cancels first
varies from run to run (the install's first statement, in a new database, nearly always); the
listener's own retry is shown deterministically in tests/queue/test_listener_setup.py."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from api_sender import Sender
from tests.drills.helpers import Fleet, create_ledger, fetchval, log_events, wait_for

pytestmark = [pytest.mark.drill, pytest.mark.xdist_group("drills-light")]

QUEUE = "drill-work"


async def test_a_statement_timeout_on_every_new_session_keeps_the_worker_up_and_not_ready(
    db_url: str, admin_url: str, fleet: Fleet, drill_report
) -> None:
    """With statement_timeout = 1ms on the database, a worker started there stays up for as long
    as it lasts, answers /readyz 503 naming the statement the server cancelled, and retries;
    once the setting is reset it becomes ready and runs a job."""
    await create_ledger(db_url)
    dbname = db_url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f"ALTER DATABASE \"{dbname}\" SET statement_timeout = '1ms'")
        daemon = fleet.start(db_url)
        reasons: set[str] = set()
        for _ in range(30):  # 3 s
            await asyncio.sleep(0.1)
            assert daemon.process.poll() is None, f"the worker exited:\n{daemon.logs()[-3000:]}"
            status, body = daemon.get("/readyz")
            if status == 503:
                reasons.add(body["reason"])
    finally:
        await admin.execute(f'ALTER DATABASE "{dbname}" RESET statement_timeout')
        await admin.close()
    assert any("QueryCanceledError" in reason for reason in reasons), reasons
    await asyncio.to_thread(daemon.wait_ready, 60)
    async with Sender.connect(db_url, max_size=1) as sender:
        job_id = await sender.send(QUEUE, {"n": 1})

        async def done() -> bool:
            state = await fetchval(db_url, "SELECT state::text FROM jobs.job WHERE id = $1", job_id)
            return state == "completed"

        await wait_for(done, 30, "the job sent after the reset")
    failed = log_events(daemon, "listener.failed")
    drill_report(
        f"start-up statements cancelled: statement_timeout=1ms on every new session -> the"
        f" worker stayed up and not ready ({'; '.join(sorted(reasons))}; listener.failed"
        f" {len(failed)}), retrying; after the reset it became ready and ran a job"
    )
