"""One-off timers: a job due at an instant, optionally keyed so a newer timer replaces it."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict, Unpack

from . import operations
from .producer import AsyncProducer, SyncProducer


class TimerKwargs(TypedDict, total=False):
    """When a timer is due (exactly one of ``at`` and ``delay_seconds``), its data and key."""

    at: datetime | None
    delay_seconds: float | None
    data: Any
    key: str | None


class Timers:
    """``sender.timers``: schedule and cancel one-off timers on a declared queue."""

    def __init__(self, sender: AsyncProducer) -> None:
        self._sender = sender

    async def schedule(
        self, queue: str, *, connection: object | None = None, **timer: Unpack[TimerKwargs]
    ) -> int:
        """Schedule a timer ``at`` an aware datetime (or after ``delay_seconds``), carrying
        ``data``, and return its job id.

        With ``key``, the timer with that key on that queue that has not finished (waiting, or
        running right now) is cancelled in the same transaction: however many replace one key at
        once, exactly one stays pending, and a replaced timer never runs again.
        """
        op = operations.schedule_timer(self._sender.schema, queue, **timer)
        return await self._sender.run(op, connection)

    async def cancel(self, queue: str, key: str, *, connection: object | None = None) -> bool:
        """Cancel the timer ``key`` on ``queue``; ``False`` when none was pending.

        Pending means not finished: a timer that is running is cancelled too (its handler runs
        to its end, but it is never retried or run again), as a replace would.
        """
        return await self._sender.run(
            operations.cancel_timer(self._sender.schema, queue, key), connection
        )


class SyncTimers:
    """``sync_sender.timers``: :class:`Timers` for the synchronous sender."""

    def __init__(self, sender: SyncProducer) -> None:
        self._sender = sender

    def schedule(
        self, queue: str, *, connection: object | None = None, **timer: Unpack[TimerKwargs]
    ) -> int:
        """See :meth:`Timers.schedule`."""
        op = operations.schedule_timer(self._sender.schema, queue, **timer)
        return self._sender.run(op, connection)

    def cancel(self, queue: str, key: str, *, connection: object | None = None) -> bool:
        """See :meth:`Timers.cancel`."""
        return self._sender.run(
            operations.cancel_timer(self._sender.schema, queue, key), connection
        )
