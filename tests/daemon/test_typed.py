"""Typed payloads in a real worker process: a typed handler gets its model, an invalid payload
dead-letters after exactly one attempt, and no piece of it reaches an error or a log line."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import asyncpg

from api_sender import Sender
from tests.support.ledger import create_ledger
from tests.support.processes import start_daemon
from tests.support.tooljobs import Invoice

#: What the invalid payload hides in its bad value.
SECRET = "Zq7Secret-alice@example.org-Xv9Token"


async def test_a_typed_handler_gets_its_model_and_bad_data_dead_letters_at_once(
    db_url: str, tmp_path
) -> None:
    """Invoices sent as models reach the handler as Invoice instances with their values; an
    invalid payload (five retries left) is attempted once, never reaches the handler, ends
    failed with an error naming the field, and its copy runs on the dead letter; the secret in
    it is in no error and no log line, and the failure is counted in jobs_failed_total."""
    await create_ledger(db_url)
    daemon = start_daemon(db_url, tmp_path, env={"TOOL_JOBS": "tests.support.tooljobs:TYPED"})
    try:
        await asyncio.to_thread(daemon.wait_ready, 60)
        issued = datetime(2026, 12, 1, 10, 30, tzinfo=UTC)
        async with Sender.connect(db_url, max_size=2) as sender:
            one = await sender.send(
                "tool-typed", Invoice(number=1, issued_at=issued, currency="EUR")
            )
            more = await sender.send_many(
                "tool-typed", [Invoice(number=n, issued_at=issued, currency="USD") for n in (2, 3)]
            )
            bad = await sender.send(
                "tool-typed",
                {"number": SECRET, "issued_at": issued.isoformat(), "currency": "EUR"},
            )
        conn = await asyncpg.connect(db_url)
        try:
            deadline = time.monotonic() + 30
            while True:
                done = await conn.fetchval(
                    "SELECT count(*) FROM public.ledger WHERE phase = 'done'"
                )
                failed = await conn.fetchval(
                    "SELECT count(*) FROM jobs.job WHERE id = $1 AND state = 'failed'", bad
                )
                # Three invoices and the dead letter's copy, its completion committed (the
                # ledger's 'done' is written by the handler, before the completion commits).
                copy_done = await conn.fetchval(
                    "SELECT count(*) FROM jobs.job"
                    " WHERE queue = 'tool-typed-dead' AND state = 'completed'"
                )
                if done == 4 and failed == 1 and copy_done == 1:
                    break
                assert time.monotonic() < deadline, daemon.logs()
                await asyncio.sleep(0.1)
            got = await conn.fetch(
                "SELECT job_id, phase, data->>'number' AS number, data->>'issued_at' AS issued"
                " FROM public.ledger WHERE queue = 'tool-typed' AND phase LIKE 'got %'"
            )
            row = await conn.fetchrow(
                "SELECT state::text AS state, attempt, retry_count, output->>'error' AS error"
                " FROM jobs.job WHERE id = $1",
                bad,
            )
            copies = await conn.fetch(
                "SELECT state::text AS state, data->>'number' AS number,"
                " output->>'error' AS error FROM jobs.job WHERE queue = 'tool-typed-dead'"
            )
        finally:
            await conn.close()
        assert sorted((r["job_id"], r["phase"], r["number"]) for r in got) == [
            (one, "got Invoice", "1"),
            (more[0], "got Invoice", "2"),
            (more[1], "got Invoice", "3"),
        ]
        assert {datetime.fromisoformat(r["issued"]) for r in got} == {issued}
        assert row is not None
        assert (row["state"], row["attempt"], row["retry_count"]) == ("failed", 1, 1)
        assert row["error"].startswith("payload does not validate as Invoice (1 error): number: ")
        assert "[int_parsing]" in row["error"]
        assert [(c["state"], c["number"]) for c in copies] == [("completed", SECRET)]
        for text in (row["error"], copies[0]["error"] or "", daemon.logs()):
            assert "Zq7" not in text
            assert "Xv9" not in text
            assert "alice" not in text
        [event] = [e for e in daemon.events() if e.get("event") == "job.payload_invalid"]
        assert (event["job_id"], event["queue"], event["attempt"]) == (bad, "tool-typed", 1)
        status, metrics = daemon.get("/metrics")
        assert status == 200
        assert 'jobs_failed_total{queue="tool-typed"} 1.0' in metrics
    finally:
        daemon.kill()
