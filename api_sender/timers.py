"""One-off timers: a job due at an instant, optionally keyed so a newer timer replaces it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from .errors import InvalidJob, raise_sender_error
from .options import check_text, encode_data, split_start_after
from .producer import Producer


class Timers:
    """``sender.timers``: schedule and cancel one-off timers on a declared queue."""

    def __init__(self, sender: Producer) -> None:
        self._sender = sender

    async def schedule(
        self,
        queue: str,
        *,
        at: datetime | None = None,
        delay_seconds: float | None = None,
        data: Any = None,
        key: str | None = None,
        connection: asyncpg.Connection | None = None,
    ) -> int:
        """Schedule a timer at ``at`` (or after ``delay_seconds``) and return its job id.

        With ``key``, the timer with that key on that queue that has not finished (waiting, or
        running right now) is cancelled in the same transaction: however many replace one key at
        once, exactly one stays pending, and a replaced timer never runs again.
        """
        if (at is None) == (delay_seconds is None):
            raise InvalidJob("give exactly one of at= and delay_seconds=", "at")
        check_text("queue", queue, optional=False)
        if at is not None:
            delay, instant = split_start_after(at, "at")
        else:
            delay, instant = split_start_after(delay_seconds, "delay_seconds")
        check_text("key", key)
        payload = encode_data(data)
        executor = connection if connection is not None else self._sender.pool
        try:
            job_id: int = await executor.fetchval(
                self._sender.statements.send_timer, queue, payload, key, instant, delay
            )
        except asyncpg.PostgresError as exc:
            raise_sender_error(exc, queue=queue, schema=self._sender.schema)
        return job_id

    async def cancel(
        self, queue: str, key: str, *, connection: asyncpg.Connection | None = None
    ) -> bool:
        """Cancel the timer ``key`` on ``queue``; ``False`` when none was pending.

        Pending means not finished: a timer that is running is cancelled too (its handler runs
        to its end, but it is never retried or run again), as a replace would.
        """
        check_text("queue", queue, optional=False)
        check_text("key", key, optional=False)
        executor = connection if connection is not None else self._sender.pool
        try:
            cancelled = await executor.fetchval(self._sender.statements.cancel_timer, queue, key)
        except asyncpg.PostgresError as exc:
            raise_sender_error(exc, queue=queue, schema=self._sender.schema)
        return bool(cancelled)
