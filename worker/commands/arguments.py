"""The command line's grammar: every subcommand and its arguments.

Kept apart from the commands themselves, so that parsing loads none of them: ``run`` imports
only the daemon's modules (worker/cli.py imports each command's module when it is chosen).
"""

from __future__ import annotations

import argparse
from typing import Any

from api_sender.jobs import ACTION_STATES, STATES, Action

#: The job actions of ``chassis-worker jobs``, each a subcommand.
ACTIONS: tuple[Action, ...] = tuple(ACTION_STATES)

#: How long `migrate` waits for a database that is not up yet (a server still starting).
MIGRATE_WAIT_SECONDS = 60.0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="chassis-worker", description="PostgreSQL background-work daemon"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="boot the daemon")
    run.add_argument("--role", choices=["api", "worker", "all"], help="overrides SERVICE_ROLE")
    migrate = sub.add_parser("migrate", help="apply migrations and install queues and schedules")
    migrate.add_argument(
        "--wait",
        type=float,
        default=MIGRATE_WAIT_SECONDS,
        metavar="SECONDS",
        help="how long to wait for an unreachable database (0: fail at once) [60]",
    )
    queues = sub.add_parser("queues", help="jobs per queue and state; pause, resume, purge")
    queues.add_argument("--json", action="store_true", help="print JSON")
    _add_queue_actions(queues)
    _add_jobs_parser(sub)
    send = sub.add_parser("send", help="enqueue one job and print its id")
    send.add_argument("queue")
    send.add_argument("data", metavar="JSON", help="the job's data as JSON")
    send.add_argument("--start-after", type=float, metavar="SECONDS", default=None)
    send.add_argument("--key", default=None, help="singleton key")
    _add_held_parser(sub)
    return parser


def _add_jobs_parser(sub: Any) -> None:
    """Register ``jobs list|show|retry|cancel|resume|delete``."""
    jobs = sub.add_parser("jobs", help="look at jobs and act on them")
    actions = jobs.add_subparsers(dest="jobs_action", required=True)
    listing = actions.add_parser("list", help="jobs, newest first")
    listing.add_argument("--queue")
    listing.add_argument("--state", choices=STATES)
    listing.add_argument("--key")
    # Text, checked by the command (ASCII digits, in range): int() would take "١٢" or "1_0",
    # and argparse's own refusal is a usage block, not the one line of every other refusal.
    listing.add_argument("--limit", default="50", help="jobs per page (1-1000) [50]")
    listing.add_argument("--after", metavar="CURSOR", help="the next cursor of a previous page")
    listing.add_argument("--json", action="store_true")
    show = actions.add_parser("show", help="every field of one job, its error and its data")
    show.add_argument("id")
    show.add_argument("--json", action="store_true")
    for action in ACTIONS:
        act = actions.add_parser(
            action,
            help=f"{action} jobs by id, or every job matching --queue/--state (count first)",
        )
        act.add_argument("ids", nargs="*", metavar="ID")
        act.add_argument("--queue")
        act.add_argument("--state", choices=STATES)
        act.add_argument("--since", metavar="RFC3339", help="created at or after")
        act.add_argument("--until", metavar="RFC3339", help="created before")
        act.add_argument("--yes", action="store_true", help="do it (without: print the count)")


def _add_queue_actions(queues: argparse.ArgumentParser) -> None:
    """Register ``queues pause|resume Q`` and ``queues purge Q --yes`` under ``queues``."""
    actions = queues.add_subparsers(dest="queue_action", required=False)
    for name, text in (
        ("pause", "no replica starts a job of the queue until resume"),
        ("resume", "start the queue's jobs again, at once"),
        ("purge", "delete the queue's waiting jobs (created and retry)"),
    ):
        action = actions.add_parser(name, help=text)
        action.add_argument("queue")
        if name == "purge":
            action.add_argument("--yes", action="store_true", help="do it (without: the count)")


def _add_held_parser(sub: Any) -> None:
    """Register ``held list|redrive|discard``."""
    held = sub.add_parser("held", help="held usage events: list, redrive, discard")
    actions = held.add_subparsers(dest="held_action", required=True)
    listing = actions.add_parser("list", help="list held events")
    listing.add_argument("--json", action="store_true")
    listing.add_argument(
        "--limit", type=int, default=1000, help="show at most this many (0: all) [1000]"
    )
    redrive = actions.add_parser("redrive", help="send held events back now")
    redrive.add_argument("ids", nargs="*")
    redrive.add_argument("--all", action="store_true")
    discard = actions.add_parser("discard", help="drop held events (writes an audit row)")
    discard.add_argument("ids", nargs="+")
    discard.add_argument("--yes", action="store_true")
