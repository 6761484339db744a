"""``sender.queues``: pause, resume and purge a queue (contract section 10).

Pause is a flag on the queue row that every claim reads in SQL: from the commit of ``pause`` no
replica starts a new job of that queue (a replica already in a claim's statement finishes it),
sends are still accepted and cron still enqueues. ``resume`` wakes every replica at once. Each
action writes its audit row in the same statement.
"""

from __future__ import annotations

from typing import Any, Literal

import asyncpg

from . import job_queries as q
from .errors import PermissionDenied, QueueNotFound
from .jobs import Actor
from .query import Query, Rendered

QueueAction = Literal["pause", "resume", "purge"]

_ACTIONS: dict[QueueAction, Query] = {
    "pause": q.QUEUE_PAUSE,
    "resume": q.QUEUE_RESUME,
    "purge": q.QUEUE_PURGE,
}


class QueuesApi:
    """``sender.queues``: queue-level actions on one queue schema."""

    def __init__(self, pool: asyncpg.Pool, schema: str, *, actor: Actor | None = None) -> None:
        self._pool = pool
        self._schema = schema
        self._actor = actor or Actor()
        self._rendered: dict[str, Rendered] = {}

    def as_actor(self, actor: Actor) -> QueuesApi:
        """The same API recording ``actor`` in its audit rows."""
        return QueuesApi(self._pool, self._schema, actor=actor)

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
        query = _ACTIONS[action]
        sql = self._rendered.get(query.name)
        if sql is None:
            sql = self._rendered[query.name] = query.render(self._schema)
        values: dict[str, Any] = {
            "queue": queue,
            "actor_via": self._actor.via,
            "principal": self._actor.principal,
        }
        try:
            row = await self._pool.fetchrow(sql.text, *sql.args(values))
        except asyncpg.InsufficientPrivilegeError as exc:
            raise PermissionDenied(f"queues.{action}", str(exc)) from None
        assert row is not None
        if not row["found"]:
            raise QueueNotFound(queue, self._schema)
        changed: int = row["changed"]
        return changed
