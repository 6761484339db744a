"""The ``chassis-worker`` command line: parse, load settings, configure logs, run, exit code."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import structlog

from .commands.failures import describe_failure, innermost
from .commands.output import UsageError
from .logging import configure_logging
from .settings import ConfigError, Settings, load_settings

log = structlog.get_logger("worker.cli")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CONFIG = 2

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
    from .commands.jobs import add_jobs_parser, add_queue_actions

    add_queue_actions(queues)
    add_jobs_parser(sub)
    send = sub.add_parser("send", help="enqueue one job and print its id")
    send.add_argument("queue")
    send.add_argument("data", metavar="JSON", help="the job's data as JSON")
    send.add_argument("--start-after", type=float, metavar="SECONDS", default=None)
    send.add_argument("--key", default=None, help="singleton key")
    from .commands.held import add_held_parser

    add_held_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns (and exits with) the exit code."""
    code = _main(argv)
    sys.exit(code)


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    overrides: dict[str, Any] = {}
    if getattr(args, "role", None):
        overrides["service_role"] = args.role
    try:
        settings = load_settings(**overrides)
        installs = args.command == "migrate" or (args.command == "run" and settings.is_worker)
        settings.check_session_url(installs=installs)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_CONFIG
    # The daemon's log is its stdout; every other command keeps stdout for its output.
    stream = sys.stdout if args.command == "run" else sys.stderr
    configure_logging(settings.log_level, settings.log_format, stream)
    try:
        command = _command(args)
        return anyio.run(command, settings, args, backend_options={"use_uvloop": True})
    except KeyboardInterrupt:
        return EXIT_ERROR
    except Exception as raised:
        # A refusal raised inside the daemon's task groups (the install) arrives wrapped.
        return _report(innermost(raised), settings, args.command)


def _report(exc: BaseException, settings: Settings, command: str) -> int:
    """Print (and for run, log) why the command failed; return its exit code."""
    if isinstance(exc, ConfigError | UsageError):
        print(str(exc), file=sys.stderr)
        return EXIT_CONFIG
    url = settings.database_url.get_secret_value() if settings.database_url else None
    failure = describe_failure(exc, schema=settings.jobs_schema, url=url)
    event = "boot.failed" if command == "run" else "command.failed"
    if failure is None:  # not a set-up fault we know: a bug, worth its traceback
        log.error(event, error=f"{type(exc).__name__}: {exc}", exc_info=exc)
        return EXIT_ERROR
    if command == "run":
        log.error(event, error=failure.line)
    print(failure.line, file=sys.stderr)
    return failure.code


Command = Callable[[Settings, argparse.Namespace], Awaitable[int]]


def _command(args: argparse.Namespace) -> Command:
    from .commands import held, jobs, operate

    if args.command == "queues" and getattr(args, "queue_action", None):
        return jobs.queue_action_command
    commands: dict[str, Command] = {
        "run": operate.run_command,
        "migrate": operate.migrate_command,
        "queues": operate.queues_command,
        "send": operate.send_command,
        "held": held.held_command,
        "jobs": jobs.jobs_command,
    }
    return commands[args.command]
