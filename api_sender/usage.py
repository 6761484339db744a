"""Durable usage emission and the ONE statement of how a usage event is sent.

The sink (``sender.usage.emit``) and the worker's held-queue re-drive both build their sends
from :func:`usage_send_options`, so a re-driven event travels exactly like a fresh one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import structlog
from prometheus_client import Counter

from . import operations
from .events import UsageEvent
from .operation import Op
from .options import SendOptions, StartAfter
from .producer import AsyncProducer, SyncProducer

#: The queue usage events wait in until the hub has them.
USAGE_QUEUE = "usage-events"
#: Its dead letter: batches whose retry budget ran out, and events the hub held for their date.
USAGE_HELD_QUEUE = "usage-events-held"

log = structlog.get_logger("api_sender.usage")

EMIT_FAILURES = Counter(
    "usage_emit_failures_total",
    "Usage events that emit() could not enqueue (logged; the caller was not interrupted)",
)


@dataclass(frozen=True, slots=True)
class UsageRetry:
    """The usage queue's retry budget and the hold before a held event's next round."""

    #: Retries before a batch is held.
    limit: int = 10
    #: The first retry's delay in seconds, doubled at each retry.
    delay_seconds: int = 30
    #: How long a held event waits before it goes back to the usage queue.
    held_delay_seconds: int = 3600


def usage_send_options(
    event_id: str | None, retry: UsageRetry, *, start_after: StartAfter = None
) -> SendOptions:
    """How every usage event is sent: its id as a label, the budget, backoff on.

    The dead letter is the queue's own setting (installed by the worker), never named per send,
    so an api replica can send before any worker has installed the held queue.
    """
    return SendOptions(
        singleton_key=event_id,
        retry_limit=retry.limit,
        retry_delay=retry.delay_seconds,
        retry_backoff=True,
        start_after=start_after,
    )


def emit_op(schema: str, event: UsageEvent, retry: UsageRetry) -> Op[int | None]:
    """The operation of one usage event's send (how every usage event travels)."""
    return operations.send(
        schema, USAGE_QUEUE, event.to_job_data(), usage_send_options(event.id, retry)
    )


def resend_op(
    schema: str, payloads: Sequence[Any], retry: UsageRetry, start_after: StartAfter = None
) -> Op[list[int]]:
    """Send already-encoded events (the queue's job data) to the usage queue in one statement,
    each with :func:`usage_send_options` and its own id as key."""
    keys = [event_id_of(payload) for payload in payloads]
    # The shared options come from the one statement of how usage is sent; only the key
    # differs per event, and send_many takes those as a list.
    options = usage_send_options(keys[0] if keys else None, retry, start_after=start_after)
    return operations.send_many(schema, USAGE_QUEUE, payloads, options, singleton_keys=keys)


def emit_failed(event: UsageEvent, exc: Exception) -> None:
    """Log and count an emit that failed (it never raises into the caller)."""
    EMIT_FAILURES.inc()
    # getattr: the log line itself must not raise, even for a caller's wrong argument.
    log.error(
        "usage.emit_failed",
        event_id=getattr(event, "id", None),
        meter=getattr(event, "meter", None),
        workspace_id=getattr(event, "workspace_id", None),
        error=f"{type(exc).__name__}: {exc}",
    )


class UsageSink:
    """``sender.usage``: emit usage events durably without ever failing the caller."""

    def __init__(
        self, sender: AsyncProducer, *, retry: UsageRetry | None = None, emit_timeout: float = 10.0
    ) -> None:
        self._sender = sender
        self.retry = retry or UsageRetry()
        #: How long one emit may wait for the database before it gives up (logged, counted).
        self.emit_timeout = emit_timeout

    async def emit(self, event: UsageEvent) -> int | None:
        """Enqueue ``event`` on the usage queue; on any failure log, count and return ``None``.

        Bounded by ``emit_timeout`` so a database that hangs cannot stall the caller's request.
        """
        try:
            with anyio.fail_after(self.emit_timeout):
                return await self._sender.run(emit_op(self._sender.schema, event, self.retry))
        except Exception as exc:
            emit_failed(event, exc)
            return None

    async def enqueue(
        self, events: Sequence[UsageEvent], *, connection: object | None = None
    ) -> list[int]:
        """Enqueue ``events`` in one statement, all or none; raises on failure (ingest's path)."""
        return await self.resend([event.to_job_data() for event in events], connection=connection)

    async def resend(
        self,
        payloads: Sequence[Any],
        *,
        start_after: StartAfter = None,
        connection: object | None = None,
    ) -> list[int]:
        """Send already-encoded events (the queue's job data) back to the usage queue, all or
        none, each with :func:`usage_send_options` and its own id as key; raises on failure."""
        op = resend_op(self._sender.schema, payloads, self.retry, start_after)
        return await self._sender.run(op, connection)


class SyncUsageSink:
    """``sync_sender.usage``: :class:`UsageSink` for the synchronous sender. ``emit`` never
    raises into the caller; its time is bounded by the connection's own timeouts."""

    def __init__(self, sender: SyncProducer, *, retry: UsageRetry | None = None) -> None:
        self._sender = sender
        self.retry = retry or UsageRetry()

    def emit(self, event: UsageEvent) -> int | None:
        """See :meth:`UsageSink.emit`."""
        try:
            return self._sender.run(emit_op(self._sender.schema, event, self.retry))
        except Exception as exc:
            emit_failed(event, exc)
            return None

    def enqueue(
        self, events: Sequence[UsageEvent], *, connection: object | None = None
    ) -> list[int]:
        """See :meth:`UsageSink.enqueue`."""
        payloads = [event.to_job_data() for event in events]
        return self._sender.run(resend_op(self._sender.schema, payloads, self.retry), connection)


def event_id_of(payload: Any) -> str | None:
    """The event id a usage job's data carries, or ``None`` when it carries none."""
    if isinstance(payload, Mapping):
        value = payload.get("id")
        if isinstance(value, str) and value:
            return value
    return None
