"""structlog set-up: JSON lines off a TTY, one event name per line, secrets never printed."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
_SECRET_MARKERS = ("secret", "password", "token", "authorization")


def _redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Mask any field whose name says it holds a secret (a second line of defence)."""
    for key in list(event):
        if any(marker in key.lower() for marker in _SECRET_MARKERS):
            event[key] = "***"
    return event


def configure_logging(
    level: str = "info", fmt: str | None = None, stream: TextIO | None = None
) -> None:
    """Configure structlog for the process; ``fmt`` None picks json when stdout is not a TTY,
    console when it is (contract section 3).

    ``stream`` is where the lines go: stdout for ``run`` (the daemon's log), stderr for every
    other command, whose stdout carries only its output (``queues --json | jq``).
    """
    if fmt is None:
        fmt = "console" if sys.stdout.isatty() else "json"
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stdout),
        cache_logger_on_first_use=False,
    )
    # Libraries that log through the standard library (uvicorn, asyncpg) stay quiet below warning.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s %(message)s")
