"""A cancel NOTIFY is a hint, checked against the job rows before it interrupts anything (contract
section 10): one any role sends (issue 28, item 3), or one that arrives after the job was retried
and claimed again (item 14), interrupts no handler; a real cancel still does within 2 s."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from api_sender import Sender
from api_sender.schema import cancel_channel
from tests.ops.test_operations_live import (
    SLOW_POLL,
    cancel_interrupted,
    rows,
    start_workers,
    wait_for,
    wait_started,
)
from tests.support.ledger import create_ledger
from tests.support.processes import Daemon

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("processes")]

CHANNEL = cancel_channel("jobs")


def with_user(url: str, user: str) -> str:
    """``url`` logging in as ``user`` (no password: the test server trusts local logins)."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, f"{user}@{host}", parts.path, parts.query, parts.fragment))


async def phases(url: str, job_id: int) -> list[tuple[int, str]]:
    """(attempt, phase) of every ledger row of ``job_id``, in order."""
    found = await rows(
        url, "SELECT attempt, phase FROM public.ledger WHERE job_id = $1 ORDER BY seq", job_id
    )
    return [(r["attempt"], r["phase"]) for r in found]


async def owner_of(url: str, job_id: int) -> str:
    """The worker id a running job's row names (``locked_by``: readable by any role that may
    read the job table)."""
    [row] = await rows(url, "SELECT locked_by::text AS owner FROM jobs.job WHERE id = $1", job_id)
    return str(row["owner"])


async def state_of(url: str, job_id: int) -> str:
    """The job's state now."""
    [row] = await rows(url, "SELECT state::text AS state FROM jobs.job WHERE id = $1", job_id)
    return str(row["state"])


def events(daemon: Daemon, name: str) -> list[dict[str, Any]]:
    """The daemon's log lines of event ``name``."""
    return [e for e in daemon.events() if e.get("event") == name]


async def completed_or_interrupted(url: str, daemon: Daemon, job_id: int) -> None:
    """Wait (20 s at most) until the job completed, or its handler was interrupted."""

    async def settled() -> bool:
        return cancel_interrupted(daemon, job_id) or await state_of(url, job_id) == "completed"

    await wait_for(settled, 20)


async def test_a_forged_cancel_notify_interrupts_nothing_and_a_real_cancel_still_does(
    db_url: str, tmp_path
) -> None:
    """A role with no rights at all NOTIFYs the cancel channel with a running job's id and its
    worker's id, in a burst: the handler is not interrupted and the job completes normally, the
    hints logged as ignored; a real cancel (and a delete) of another running job still interrupts
    it within 2 s."""
    await create_ledger(db_url)
    forger = f"forger_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(db_url)
    await admin.execute(f'CREATE ROLE "{forger}" LOGIN')
    try:
        [daemon] = await start_workers(db_url, tmp_path, 1, **SLOW_POLL)
        try:
            async with Sender.connect(db_url, max_size=2) as sender:
                job_id = await sender.send("tool-work", {"sleep": 3})
                assert job_id is not None
                await wait_started(db_url, job_id)
                owner = await owner_of(db_url, job_id)
                conn = await asyncpg.connect(with_user(db_url, forger))
                try:
                    for n in range(20):
                        await conn.execute(
                            "SELECT pg_notify($1, $2)", CHANNEL, f"{owner} {job_id},{n + 10**6}"
                        )
                finally:
                    await conn.close()
                await completed_or_interrupted(db_url, daemon, job_id)
                assert not cancel_interrupted(daemon, job_id), "a forged NOTIFY interrupted it"
                assert await state_of(db_url, job_id) == "completed"
                assert await phases(db_url, job_id) == [(1, "start"), (1, "done")]
                ignored = events(daemon, "job.cancel_hint_ignored")
                assert ignored
                assert all(job_id in e["ids"] for e in ignored)
                assert any(e["running"] == [job_id] for e in ignored)

                real = await sender.send("tool-work", {"sleep": 60})
                assert real is not None
                await wait_started(db_url, real)
                asked = time.monotonic()
                assert await sender.jobs.cancel([real]) == [real]
                while not cancel_interrupted(daemon, real):
                    assert time.monotonic() - asked < 2.0, "the real cancel took over 2 s"
                    await asyncio.sleep(0.02)
                assert await state_of(db_url, real) == "cancelled"

                # A delete leaves no row: that confirms it for any claim.
                gone = await sender.send("tool-work", {"sleep": 60})
                assert gone is not None
                await wait_started(db_url, gone)
                asked = time.monotonic()
                assert await sender.jobs.delete([gone]) == [gone]
                while not cancel_interrupted(daemon, gone):
                    assert time.monotonic() - asked < 2.0, "the delete took over 2 s"
                    await asyncio.sleep(0.02)
        finally:
            daemon.stop()
    finally:
        await admin.execute(f'DROP ROLE "{forger}"')
        await admin.close()
    assert not events(daemon, "job.lease_lost")


async def test_a_late_cancel_notify_leaves_the_jobs_new_run_alone(db_url: str, tmp_path) -> None:
    """A job cancelled while it runs, retried and claimed again by the same worker before that
    worker hears of the cancel: the late NOTIFY (sent here once the new run has started, as a
    delayed delivery would come) does not interrupt the new run, which completes."""
    await create_ledger(db_url)
    [daemon] = await start_workers(db_url, tmp_path, 1, **SLOW_POLL)
    try:
        async with Sender.connect(db_url, max_size=2) as sender:
            job_id = await sender.send("tool-work", {"sleep": 2})
            assert job_id is not None
            await wait_started(db_url, job_id)
            owner = await owner_of(db_url, job_id)
            # The cancel as jobs.cancel writes it, its NOTIFY held back.
            await rows(
                db_url,
                "UPDATE jobs.job SET state = 'cancelled', completed_at = now()"
                " WHERE id = $1 AND state = 'active'",
                job_id,
            )

            async def first_run_over() -> bool:
                return (1, "done") in await phases(db_url, job_id)

            await wait_for(first_run_over, 15)
            assert await sender.jobs.retry([job_id]) == [job_id]

            async def second_run_started() -> bool:
                return (2, "start") in await phases(db_url, job_id)

            await wait_for(second_run_started, 15)
            # The held-back NOTIFY arrives now, naming the job, not the claim.
            await rows(db_url, "SELECT pg_notify($1, $2)", CHANNEL, f"{owner} {job_id}")
            await completed_or_interrupted(db_url, daemon, job_id)
            assert not cancel_interrupted(daemon, job_id), "the late NOTIFY interrupted the new run"
            assert await state_of(db_url, job_id) == "completed"
            assert await phases(db_url, job_id) == [
                (1, "start"),
                (1, "done"),
                (2, "start"),
                (2, "done"),
            ]
    finally:
        daemon.stop()
    assert any(job_id in e["ids"] for e in events(daemon, "job.cancel_hint_ignored"))


async def test_a_job_running_twice_in_one_worker_after_a_late_cancel_keeps_both_runs_apart(
    db_url: str, tmp_path
) -> None:
    """A job cancelled, retried and claimed again by the same worker while its first handler
    still runs (the cancel's NOTIFY not yet heard): the two runs are told apart, the late NOTIFY
    interrupts neither, both handlers end, the worker stays up and the job completes."""
    await create_ledger(db_url)
    [daemon] = await start_workers(db_url, tmp_path, 1, **SLOW_POLL)
    try:
        async with Sender.connect(db_url, max_size=2) as sender:
            job_id = await sender.send("tool-work", {"sleep": 4})
            assert job_id is not None
            await wait_started(db_url, job_id)
            owner = await owner_of(db_url, job_id)
            await rows(
                db_url,
                "UPDATE jobs.job SET state = 'cancelled', completed_at = now()"
                " WHERE id = $1 AND state = 'active'",
                job_id,
            )
            assert await sender.jobs.retry([job_id]) == [job_id]

            async def second_run_started() -> bool:
                return (2, "start") in await phases(db_url, job_id)

            await wait_for(second_run_started, 15)
            assert (1, "done") not in await phases(db_url, job_id), "the first run ended early"
            await rows(db_url, "SELECT pg_notify($1, $2)", CHANNEL, f"{owner} {job_id}")

            async def both_done() -> bool:
                assert daemon.process.poll() is None, f"the worker exited:\n{daemon.logs()}"
                done = {(1, "done"), (2, "done")}
                return done <= set(await phases(db_url, job_id))

            await wait_for(both_done, 20)
            assert await state_of(db_url, job_id) == "completed"
            assert not cancel_interrupted(daemon, job_id)
            status, _ = daemon.get("/readyz")
            assert status == 200
    finally:
        daemon.stop()
