"""``sender.queues``: pause, resume and purge a queue (contract section 10).

Pause is a flag on the queue row that every claim reads in SQL: from the commit of ``pause`` no
replica starts a new job of that queue (a replica already in a claim's statement finishes it),
sends are still accepted and cron still enqueues. ``resume`` wakes every replica at once. Each
action writes its audit row in the same statement.
"""

from __future__ import annotations

from typing import Any, Literal

from . import job_queries as q
from .driver import AsyncDriver, SyncDriver, run_async, run_sync
from .errors import QueueNotFound
from .jobs import Actor, denied
from .operation import Op, Rows, first, one
from .query import Query

QueueAction = Literal["pause", "resume", "purge"]

_ACTIONS: dict[QueueAction, Query] = {
    "pause": q.QUEUE_PAUSE,
    "resume": q.QUEUE_RESUME,
    "purge": q.QUEUE_PURGE,
}


def queue_action(schema: str, actor: Actor, action: QueueAction, queue: str) -> Op[int]:
    """``action`` on ``queue`` with its audit row: how many rows it changed."""
    values: dict[str, Any] = {
        "queue": queue,
        "actor_via": actor.via,
        "principal": actor.principal,
    }

    def decode(rows: Rows) -> int:
        row = first(rows)
        if not row["found"]:
            raise QueueNotFound(queue, schema)
        changed: int = row["changed"]
        return changed

    return one(_ACTIONS[action], values, decode, errors=denied(f"queues.{action}"))


class QueuesApi:
    """``sender.queues``: queue-level actions on one queue schema."""

    def __init__(self, driver: AsyncDriver, *, actor: Actor | None = None) -> None:
        self._driver = driver
        self._actor = actor or Actor()

    def as_actor(self, actor: Actor) -> QueuesApi:
        """The same API recording ``actor`` in its audit rows."""
        return QueuesApi(self._driver, actor=actor)

    async def pause(self, queue: str) -> bool:
        """Stop every replica from starting jobs of ``queue``; ``False`` if it was paused."""
        return await self._act("pause", queue) > 0

    async def resume(self, queue: str) -> bool:
        """Let ``queue``'s jobs start again, at once; ``False`` if it was not paused."""
        return await self._act("resume", queue) > 0

    async def purge(self, queue: str) -> int:
        """Delete ``queue``'s waiting (created and retry) jobs; how many were deleted."""
        return await self._act("purge", queue)

    async def _act(self, action: QueueAction, queue: str) -> int:
        op = queue_action(self._driver.schema, self._actor, action, queue)
        return await run_async(self._driver, op)


class SyncQueuesApi:
    """``sync_sender.queues``: :class:`QueuesApi` for the synchronous sender."""

    def __init__(self, driver: SyncDriver, *, actor: Actor | None = None) -> None:
        self._driver = driver
        self._actor = actor or Actor()

    def as_actor(self, actor: Actor) -> SyncQueuesApi:
        """The same API recording ``actor`` in its audit rows."""
        return SyncQueuesApi(self._driver, actor=actor)

    def pause(self, queue: str) -> bool:
        """See :meth:`QueuesApi.pause`."""
        return self._act("pause", queue) > 0

    def resume(self, queue: str) -> bool:
        """See :meth:`QueuesApi.resume`."""
        return self._act("resume", queue) > 0

    def purge(self, queue: str) -> int:
        """See :meth:`QueuesApi.purge`."""
        return self._act("purge", queue)

    def _act(self, action: QueueAction, queue: str) -> int:
        return run_sync(self._driver, queue_action(self._driver.schema, self._actor, action, queue))
