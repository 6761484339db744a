"""``chassis-worker held``: operator tools for held usage events (contract section 2).

``list [--json]`` shows them, ``redrive ID...|--all`` makes them due now, ``discard ID... --yes``
drops them for good, the one way an event leaves the pipeline undelivered, with an audit row
naming the operator's OS user, the ids and the time.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys

import structlog

from api_sender import Actor

from ..boot import database_url
from ..jobs.usage.operator import EVERYTHING, HeldRow, HeldStore, Selection
from ..settings import Settings
from .failures import reaching
from .output import UsageError, print_json
from .output import shown as escaped
from .senders import open_sender

log = structlog.get_logger("worker.held")


def operator_name() -> str:
    """The OS user running the command (the audit row's principal)."""
    try:
        return getpass.getuser()
    except Exception:  # no login name and no passwd entry (some containers)
        return f"uid:{os.getuid()}"


async def held_command(settings: Settings, args: argparse.Namespace) -> int:
    """Dispatch the held subcommands; 0 done, 1 some named id was not held, 2 bad arguments."""
    selection = _selection(args, UsageError)
    url = await database_url(settings)
    async with reaching(url):
        sender = await open_sender(settings, url)
    try:
        store = HeldStore(sender)
        if args.held_action == "list":
            rows = await store.listing(limit=args.limit if args.limit > 0 else None)
            total = len(rows) if args.limit <= 0 or len(rows) < args.limit else await store.count()
            if args.json:
                print_json({"held": [row.as_json() for row in rows], "count": total})
            else:
                _print_table(rows, total)
            return 0
        actor = Actor("cli", operator_name())
        if args.held_action == "redrive":
            done = await store.redrive(selection, actor)
            log.info("held.redriven", ids=done, count=len(done), actor=actor.principal)
            print(f"redriven {len(done)} event(s), due now")
        else:
            done = await store.discard(selection, actor)
            log.warning("held.discarded", ids=done, count=len(done), actor=actor.principal)
            print(f"discarded {len(done)} event(s); audit row written" if done else "discarded 0")
    finally:
        await sender.pool.close()
    for event_id in done:
        print(event_id)
    missing = [] if selection.everything else selection.missing(done)
    if missing:
        print(f"not held (nothing done): {' '.join(missing)}", file=sys.stderr)
        return 1
    return 0


def _selection(args: argparse.Namespace, usage_error: type[Exception]) -> Selection:
    if args.held_action == "list":
        return EVERYTHING
    if args.held_action == "discard" and not args.yes:
        raise usage_error(
            "held discard drops these events for good (they are never delivered); "
            "pass --yes to confirm"
        )
    if args.held_action == "redrive" and getattr(args, "all", False):
        if args.ids:
            raise usage_error("held redrive: give event ids or --all, not both")
        return EVERYTHING
    if not args.ids:
        raise usage_error("held redrive: give event ids or --all")
    try:
        return Selection.of(args.ids)
    except ValueError as exc:
        raise usage_error(f"invalid id: {exc}") from None


def _print_table(rows: list[HeldRow], total: int) -> None:
    if not rows:
        print("no held events")
        return
    lines = [["id", "status", "reason", "due_at", "meter", "workspace_id", "quantity"]]
    for row in rows:
        shown = row.as_json()
        # Meter and workspace are ingested text (and any field a row holds): escaped.
        lines.append(
            [
                escaped(row.id),
                row.status,
                escaped(row.reason or "-"),
                escaped(shown["due_at"]),
                escaped(shown["meter"]),
                escaped(shown["workspace_id"]),
                escaped(shown["quantity"]),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for line in lines:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))
    cut = f" (first {len(rows)} shown; --limit 0 shows all)" if total > len(rows) else ""
    print(f"{total} held event(s){cut}")
