"""Enqueue from every Python stack (contract section 11): inside the stack's own transaction, a
rolled-back send leaves no job and a committed one is run by a worker woken through NOTIFY.

One worker process serves the whole module; it polls only every 300 s, so a run soon after the
commit (the wait below is far shorter) can only come from the send's NOTIFY.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Iterator

import asyncpg
import pytest

from tests.producers.stacks import QUEUE, STACKS
from tests.support.ledger import create_ledger
from tests.support.postgres import create_database, drop_database, with_database
from tests.support.processes import Daemon, start_daemon

#: The worker's poll: longer than this module's whole run, so no pickup here comes from it.
POLL_SECONDS = "300"
#: How long a committed job may take to run: far under the poll.
PICKUP_SECONDS = 60


@pytest.fixture(scope="module")
def stack_db(admin_url: str, template_name: str) -> Iterator[str]:
    """A migrated database for this module."""
    name = asyncio.run(create_database(admin_url, template_name))
    try:
        yield with_database(admin_url, name)
    finally:
        asyncio.run(drop_database(admin_url, name))


@pytest.fixture(scope="module")
def worker(stack_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A worker running tool-work, ready (its queues installed), polling every 300 s."""
    asyncio.run(create_ledger(stack_db))
    daemon = start_daemon(
        stack_db,
        tmp_path_factory.mktemp("stack-worker"),
        env={"TOOL_JOBS": "tests.support.tooljobs:WORK", "POLL_INTERVAL_SECONDS": POLL_SECONDS},
    )
    try:
        daemon.wait_ready(60)
        yield daemon
    finally:
        daemon.stop()


async def _done(conn: asyncpg.Connection, job_id: int) -> bool:
    """The handler ran to its end and the worker recorded the job completed."""
    return bool(
        await conn.fetchval(
            "SELECT count(*) FROM public.ledger l JOIN jobs.job j ON j.id = l.job_id"
            " WHERE l.job_id = $1 AND l.phase = 'done' AND j.state = 'completed'",
            job_id,
        )
    )


@pytest.mark.parametrize("stack", list(STACKS))
async def test_a_rolled_back_send_leaves_no_job_and_a_committed_one_runs_at_once(
    stack: str, stack_db: str, worker: Daemon
) -> None:
    """Through the stack's own connection and transaction: the rolled-back job does not exist
    and never runs; the committed one runs, woken by its NOTIFY (long before any poll)."""
    assert worker.env["POLL_INTERVAL_SECONDS"] == POLL_SECONDS
    produce = STACKS[stack]
    if inspect.iscoroutinefunction(produce):
        rolled, kept = await produce(stack_db)
    else:
        rolled, kept = await asyncio.to_thread(produce, stack_db)
    conn = await asyncpg.connect(stack_db)
    try:
        deadline = time.monotonic() + PICKUP_SECONDS
        while not await _done(conn, kept):
            assert time.monotonic() < deadline, (
                f"committed job {kept} did not run within {PICKUP_SECONDS} s\n{worker.logs()}"
            )
            await asyncio.sleep(0.05)
        kept_row = await conn.fetchrow(
            "SELECT queue, state::text AS state, data->>'stack' AS stack FROM jobs.job"
            " WHERE id = $1",
            kept,
        )
        assert kept_row is not None
        assert (kept_row["queue"], kept_row["state"]) == (QUEUE, "completed")
        assert await conn.fetchval("SELECT count(*) FROM jobs.job WHERE id = $1", rolled) == 0
        assert (
            await conn.fetchval("SELECT count(*) FROM public.ledger WHERE job_id = $1", rolled) == 0
        )
    finally:
        await conn.close()
