"""The ``chassis-worker`` command line: parse, load settings, configure logs, run, exit code."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import structlog

from .commands.arguments import build_parser
from .commands.failures import describe_failure, innermost
from .commands.output import UsageError
from .logging import configure_logging
from .settings import ConfigError, Settings, load_settings

log = structlog.get_logger("worker.cli")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CONFIG = 2


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
    """The chosen command, importing its module only: ``run`` loads none of the others."""
    match args.command:
        case "run":
            from .commands.daemon import run_command

            return run_command
        case "migrate":
            from .commands.daemon import migrate_command

            return migrate_command
        case "queues" if getattr(args, "queue_action", None):
            from .commands.jobs import queue_action_command

            return queue_action_command
        case "queues":
            from .commands.operate import queues_command

            return queues_command
        case "send":
            from .commands.operate import send_command

            return send_command
        case "held":
            from .commands.held import held_command

            return held_command
        case "jobs":
            from .commands.jobs import jobs_command

            return jobs_command
    raise AssertionError(f"no command {args.command!r}")  # the parser allows no other
