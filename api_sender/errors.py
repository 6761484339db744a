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
