"""Held events for an operator: list them, make them due now, or discard them with an audit row."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import asyncpg

from api_sender import USAGE_HELD_QUEUE, USAGE_QUEUE, Actor, Sender
from api_sender.jobs import decimal_id

from ...db import statements as db
from .holds import hold_reason
from .sql import HeldStatements, render

#: An event id token for data without one: ``job:<job id>``.
JOB_PREFIX = "job:"


@dataclass(frozen=True, slots=True)
class Selection:
    """Which held events a command acts on: all, or these event ids and job ids."""

    everything: bool = False
    event_ids: tuple[str, ...] = ()
    job_ids: tuple[int, ...] = ()

    @classmethod
    def of(cls, tokens: Iterable[str]) -> Selection:
        """Event ids (ULIDs, any case) and ``job:<id>`` tokens; ``ValueError`` for a bad one."""
        events: list[str] = []
        jobs: list[int] = []
        for token in tokens:
            text = token.strip()
            if text.lower().startswith(JOB_PREFIX):
                number = decimal_id(text[len(JOB_PREFIX) :])
                if number is None:
                    raise ValueError(f"{token!r} is not job:<id> (an id of ASCII digits)")
                jobs.append(number)
            elif text:
                events.append(text.upper())
            else:
                raise ValueError("an empty id")
        return cls(False, tuple(events), tuple(jobs))

    def args(self) -> dict[str, Any]:
        """The three statement parameters of a selection, by name."""
        return {
            "everything": self.everything,
            "event_ids": list(self.event_ids),
            "job_ids": list(self.job_ids),
        }

    def missing(self, found: Iterable[str]) -> list[str]:
        """The named ids none of ``found`` matched."""
        seen = set(found)
        named = [*self.event_ids, *(f"{JOB_PREFIX}{n}" for n in self.job_ids)]
        return [token for token in named if token not in seen]


EVERYTHING = Selection(everything=True)


@dataclass(frozen=True, slots=True)
class HeldRow:
    """One held event as ``held list`` shows it."""

    id: str
    job_id: int
    #: ``held``: on the held queue, about to be re-sent; ``waiting``: re-sent, due at ``due_at``.
    status: Literal["held", "waiting"]
    #: Why it was held (known while on the held queue).
    reason: str | None
    due_at: datetime
    data: Any

    def as_json(self) -> dict[str, Any]:
        """The row as ``held list --json`` prints it."""
        data = self.data if isinstance(self.data, dict) else {}
        return {
            "id": self.id,
            "job_id": self.job_id,
            "status": self.status,
            "reason": self.reason,
            "due_at": self.due_at.isoformat(),
            "meter": data.get("meter"),
            "workspace_id": data.get("workspace_id"),
            "quantity": data.get("quantity"),
            "occurred_at": data.get("occurred_at"),
        }


class HeldStore:
    """The held tools' reads and writes, each one transaction."""

    def __init__(self, sender: Sender) -> None:
        self._sender = sender
        self._sql: HeldStatements = render(sender.schema)

    async def count(self) -> int:
        """How many events are held in all."""
        total: int = await db.fetchval(
            self._sender.pool,
            self._sql.count_held,
            usage_queue=USAGE_QUEUE,
            held_queue=USAGE_HELD_QUEUE,
        )
        return total

    async def listing(
        self, selection: Selection = EVERYTHING, *, limit: int | None = None
    ) -> list[HeldRow]:
        """The held events (or the selected ones), next due first, at most ``limit``."""
        rows = await db.fetch(
            self._sender.pool,
            self._sql.list_held,
            usage_queue=USAGE_QUEUE,
            held_queue=USAGE_HELD_QUEUE,
            limit=limit,
            **selection.args(),
        )
        out = []
        for row in rows:
            data = json.loads(row["data"]) if row["data"] is not None else None
            on_held = row["queue"] == USAGE_HELD_QUEUE
            event_id = data.get("id") if isinstance(data, dict) else None
            out.append(
                HeldRow(
                    id=event_id if isinstance(event_id, str) else f"{JOB_PREFIX}{row['job_id']}",
                    job_id=row["job_id"],
                    status="held" if on_held else "waiting",
                    reason=hold_reason(row["singleton_key"]) if on_held else None,
                    due_at=row["start_after"],
                    data=data,
                )
            )
        return out

    async def redrive(self, selection: Selection, actor: Actor) -> list[str]:
        """Make the selected held events due now, with the audit row; return their ids."""
        async with self._sender.pool.acquire() as conn, conn.transaction():
            waiting = await db.fetch(
                conn, self._sql.redrive_waiting, usage_queue=USAGE_QUEUE, **selection.args()
            )
            locked = await db.fetch(
                conn, self._sql.lock_held, held_queue=USAGE_HELD_QUEUE, **selection.args()
            )
            if locked:
                # Re-sent due now, with the usage send options, in this transaction: the held
                # jobs are settled if and only if their events are back on the usage queue.
                await self._sender.usage.resend(
                    [json.loads(row["data"]) for row in locked], connection=conn
                )
                await db.execute(
                    conn,
                    self._sql.settle_held,
                    ids=[row["id"] for row in locked],
                    actor=_name(actor),
                )
            ids = [row["event_id"] for row in [*waiting, *locked]]
            await _audit(conn, self._sql, actor, "usage.redrive", ids, selection)
        return ids

    async def discard(self, selection: Selection, actor: Actor) -> list[str]:
        """Cancel the selected held events and write the audit row, in one transaction; return
        the discarded ids."""
        async with self._sender.pool.acquire() as conn, conn.transaction():
            rows = await db.fetch(
                conn,
                self._sql.discard,
                usage_queue=USAGE_QUEUE,
                held_queue=USAGE_HELD_QUEUE,
                actor=_name(actor),
                **selection.args(),
            )
            ids = sorted({row["event_id"] for row in rows})
            await _audit(conn, self._sql, actor, "usage.discard", ids, selection)
        return ids


def _name(actor: Actor) -> str:
    """How a held job's output records who acted: ``principal (via)``."""
    return f"{actor.principal or 'unknown'} ({actor.via})"


async def _audit(
    conn: asyncpg.Connection,
    sql: HeldStatements,
    actor: Actor,
    action: str,
    ids: Sequence[str],
    selection: Selection,
) -> None:
    metadata: dict[str, object] = {"ids": list(ids), "count": len(ids)}
    if selection.everything:
        metadata["all"] = True
    await db.execute(
        conn,
        sql.audit,
        via=actor.via,
        principal=actor.principal,
        action=action,
        metadata=json.dumps(metadata),
    )
