"""Exceptions the producer API raises."""

from __future__ import annotations


class SenderError(Exception):
    """Base class of every error ``api_sender`` raises on purpose."""


class QueueNotFound(SenderError, LookupError):
    """The named queue is not installed in the queue schema."""

    def __init__(self, queue: str, schema: str) -> None:
        super().__init__(
            f"queue {queue!r} does not exist in schema {schema!r}; "
            "a worker install (chassis-worker migrate) creates the queues"
        )
        self.queue = queue
        self.schema = schema


class InvalidJob(SenderError, ValueError):
    """A job's payload or options cannot be enqueued; the message names the field.

    ``field`` is that name alone (``priority``, ``data.items.3.name``), or ``None`` when no
    single field is at fault, so an HTTP or CLI front end can report it without parsing text.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InvalidArgument(SenderError, ValueError):
    """An argument of a read or an action is not valid; the message names it."""


class PermissionDenied(SenderError):
    """The database role lacks a right the action needs (for example DELETE for jobs.delete and
    queues.purge, which only the worker role has: config/roles.sql)."""

    def __init__(self, action: str, detail: str) -> None:
        super().__init__(
            f"{action} is not allowed for this database role ({detail}); "
            "delete and purge need DELETE on the queue tables, which the worker role has "
            "(config/roles.sql)"
        )
        self.action = action


#: The SQLSTATEs the SQL functions of migration 0007 raise on purpose (contract section 11).
SQLSTATE_QUEUE_NOT_FOUND = "P0002"
SQLSTATE_INVALID_ARGUMENT = "22023"


def sender_error(exc: BaseException, *, queue: str, schema: str) -> SenderError | None:
    """The producer exception for a database error the enqueue functions raised on purpose, or
    ``None`` for any other error (re-raise that one as it is).

    P0002 (the queue is not installed) is :class:`QueueNotFound` for ``queue``; 22023 (an
    invalid argument) is :class:`InvalidJob` with the function's message and, as ``field``, the
    name it put in the error's COLUMN field. Works for asyncpg's errors (``sqlstate``,
    ``message``, ``column_name``) and psycopg 3's (``sqlstate``, ``diag.message_primary``,
    ``diag.column_name``) alike, so every driver maps them the same way.
    """
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate == SQLSTATE_QUEUE_NOT_FOUND:
        return QueueNotFound(queue, schema)
    if sqlstate == SQLSTATE_INVALID_ARGUMENT:
        diag = getattr(exc, "diag", None)
        message = getattr(exc, "message", None) or getattr(diag, "message_primary", None)
        field = getattr(exc, "column_name", None) or getattr(diag, "column_name", None)
        return InvalidJob(str(message or exc), field)
    return None
