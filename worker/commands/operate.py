"""queues and send: the operator's look at the queues, and one job sent by hand."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from api_sender import InvalidJob, QueueNotFound
from api_sender.jobs import STATES

from ..boot import database_url
from ..db.connections import connect
from ..queue_report import queue_report as report_on
from ..settings import Settings
from .failures import reaching
from .output import UsageError, print_json, shown
from .senders import open_sender
from .sending import prepare_send


async def queue_report(
    url: str, schema: str, *, statement_cache_size: int = 100
) -> list[dict[str, Any]]:
    """One entry per queue (:func:`worker.queue_report.queue_report`), on a connection of its
    own (with DATABASE_STATEMENT_CACHE_SIZE: it may go through a transaction pooler)."""
    async with reaching(url):
        conn = await connect(url, statement_cache_size=statement_cache_size)
    try:
        return await report_on(conn, schema)
    finally:
        await conn.close()


async def queues_command(settings: Settings, args: argparse.Namespace) -> int:
    """``chassis-worker queues [--json]``."""
    report = await queue_report(
        await database_url(settings),
        settings.jobs_schema,
        statement_cache_size=settings.database_statement_cache_size,
    )
    if args.json:
        print_json({"queues": report})
        return 0
    header = ["queue", *STATES, "oldest_waiting_s", "paused", "cron", "last_run", "last_purge"]
    lines = [header]
    for q in report:
        oldest = q["oldest_waiting_seconds"]
        # Names and schedule texts are rows anyone with the install's rights wrote: escaped.
        lines.append(
            [
                shown(q["name"]),
                *(str(q["counts"][s]) for s in STATES),
                "-" if oldest is None else f"{oldest:.1f}",
                "yes" if q["paused"] else "no",
                shown(q["cron"] or "-"),
                shown(q["last_run"] or "-"),
                shown(_purge_cell(q["last_purge"])),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))
    return 0


def _purge_cell(last: dict[str, Any] | None) -> str:
    if last is None:
        return "-"
    more = "" if last["drained"] else ", more due"
    return f"{last['finished_at']} ({last['deleted']} rows{more})"


async def send_command(settings: Settings, args: argparse.Namespace) -> int:
    """``chassis-worker send QUEUE JSON [--start-after S] [--key K]``.

    The data must be what a handler takes (a JSON object, or null); a send to usage-events must
    be a usage event the ingest would accept, and is sent as the ingest sends it.
    """
    data, options = prepare_send(
        args.queue, args.data, args.start_after, args.key, settings.usage_retry, UsageError
    )
    url = await database_url(settings)
    async with reaching(url):
        sender = await open_sender(settings, url)
    try:
        job_id = await sender.send_with(args.queue, data, options)
    except (InvalidJob, QueueNotFound) as exc:
        raise UsageError(f"error: {exc}") from None
    finally:
        await sender.pool.close()
    if job_id is None:
        print("not sent: the queue's policy already holds a job with that key", file=sys.stderr)
        return 1
    print(job_id)
    return 0
