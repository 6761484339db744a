"""structlog set-up: JSON lines off a TTY, one event name per line, secrets never printed."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from contextvars import ContextVar
from typing import Any, TextIO

import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
_SECRET_MARKERS = ("secret", "password", "token", "authorization")


#: The job the current task runs, as ``(job_id, attempt)``: a runner sets it per job (one
#: ``ContextVar.set``, no structlog binding), and every line logged in that task, or in a task
#: started from it meanwhile, carries both (unless the line names them itself).
CURRENT_JOB: ContextVar[tuple[int, int] | None] = ContextVar("chassis_current_job", default=None)


def _add_current_job(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """``job_id`` and ``attempt`` of :data:`CURRENT_JOB`, read only when a line is logged."""
    job = CURRENT_JOB.get()
    if job is not None:
        event.setdefault("job_id", job[0])
        event.setdefault("attempt", job[1])
    return event


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
            _add_current_job,
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
    # Libraries that log through the standard library (asyncpg's pool: "Failed to restore the
    # pool connection floor") stay quiet below warning, and what they do say is one structlog
    # event per record, in the same stream and format as ours: never a plain-text traceback.
    logging.basicConfig(level=logging.WARNING, handlers=[StdlibToStructlog()], force=True)


class StdlibToStructlog(logging.Handler):
    """A standard-library handler that writes each record as one structlog event: the event
    name is the library's logger name (``asyncpg.pool``), with its message, and an exception
    as one ``error`` line (its type and message) instead of a traceback."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields: dict[str, Any] = {"message": record.getMessage()}
            if record.exc_info and record.exc_info[1] is not None:
                exc = record.exc_info[1]
                fields["error"] = f"{type(exc).__name__}: {exc}"
            level = record.levelno if record.levelno in _LEVELS.values() else logging.WARNING
            if record.levelno >= logging.CRITICAL:
                level = logging.ERROR
            structlog.get_logger(record.name).log(level, record.name, **fields)
        except Exception:  # pragma: no cover - logging must never raise into the caller
            self.handleError(record)
