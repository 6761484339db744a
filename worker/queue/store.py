"""Claim, complete, fail and hand back jobs: the fenced writes of the consumer."""

from __future__ import annotations

from array import array
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any
from uuid import UUID

import asyncpg

from ..db import statements as db
from .jobs import JOB_COLUMNS, ClaimedJob
from .sql import QueueStatements


@dataclass(frozen=True, slots=True)
class Fence:
    """What identifies a batch of claims: ids, attempts and claim instants, by position (the
    owner is the store's). The ids are in ascending order: the completion statements find the
    entries of a row's id by binary search (sql._complete_update)."""

    ids: list[int]
    attempts: list[int]
    claims: list[bytes]

    @classmethod
    def of(cls, jobs: Sequence[ClaimedJob]) -> Fence:
        """The fence of these claimed jobs, sorted by id (stable: a job listed twice keeps the
        order of its entries)."""
        ordered = sorted(jobs, key=_ID)
        return cls(
            [j.id for j in ordered], [j.attempt for j in ordered], [j.claim for j in ordered]
        )


#: The length of a claim token (``timestamptz_send``: microseconds as a signed 64-bit integer).
_TOKEN = 8


@dataclass(frozen=True, slots=True)
class PackedFence:
    """A :class:`Fence` kept for a while (worker.queue.unflushed): ids and attempts as machine
    integers, the 8-byte claim tokens end to end. About 24 bytes a job instead of the lists'
    104, where each id is an int object and each token a bytes object: a drain keeps a few
    thousand completions waiting for their flush, and packing them cut the worker's memory
    growth over a drain from about 0.9 to 0.55 MiB."""

    ids: array[int]
    attempts: array[int]
    #: The claim tokens joined, 8 bytes each; a list when one is not 8 bytes long (never seen:
    #: ``timestamptz_send`` is 8 bytes), so unpacking can never misalign them.
    claims: bytes | list[bytes]

    @classmethod
    def of(cls, fence: Fence) -> PackedFence:
        """``fence``, packed."""
        claims: bytes | list[bytes]
        if all(len(token) == _TOKEN for token in fence.claims):
            claims = b"".join(fence.claims)
        else:
            claims = list(fence.claims)
        return cls(array("q", fence.ids), array("q", fence.attempts), claims)

    def __len__(self) -> int:
        return len(self.ids)

    def unpacked(self) -> Fence:
        """The fence as the statements take it."""
        claims = self.claims
        if isinstance(claims, bytes):
            claims = [claims[i : i + _TOKEN] for i in range(0, len(claims), _TOKEN)]
        return Fence(self.ids.tolist(), self.attempts.tolist(), claims)


@dataclass(frozen=True, slots=True)
class FailOutcome:
    """What a failed attempt became."""

    id: int
    queue: str
    state: str  # 'retry' or 'failed'


class JobStore:
    """The consumer's statements bound to a pool and this process's owner id."""

    def __init__(self, pool: asyncpg.Pool, sql: QueueStatements, owner: UUID) -> None:
        self.pool = pool
        self.sql = sql
        self.owner = owner

    async def claim(self, queue: str, limit: int, *, one_per_key: bool = False) -> list[ClaimedJob]:
        """Claim up to ``limit`` due jobs of ``queue``, in priority then due-time order."""
        statement = self.sql.claim_one_per_key if one_per_key else self.sql.claim
        try:
            rows = await db.fetch(self.pool, statement, queue=queue, limit=limit, owner=self.owner)
        except asyncpg.UniqueViolationError:
            if not one_per_key:
                # Jobs still carrying a one-per-key policy on a queue that no longer has it
                # (sent while a policy change was installed): claim one per key, not none.
                return await self.claim(queue, limit, one_per_key=True)
            # Another replica claimed a job of the same key at the same instant: the policy
            # index refused ours. Nothing was claimed; the next round sees the active job.
            return []
        return _ordered(_claimed(queue, rows, 0))

    async def complete_and_claim(
        self, done: Sequence[ClaimedJob], queue: str, limit: int, *, lazy: bool = False
    ) -> tuple[list[ClaimedJob], set[int]]:
        """Complete ``done`` and claim up to ``limit`` jobs of ``queue`` in one statement.

        Returns the claimed jobs (as :meth:`claim`) and the ids of ``done`` that no longer
        matched their claim (as :meth:`complete_lost`). Not for one-per-key queues. ``lazy``:
        the commit does not wait for the WAL flush (the caller keeps ``done`` until it has).
        """
        if not done:
            return await self.claim(queue, limit), set()
        try:
            rows = await db.fetch(
                self.pool,
                self.sql.complete_and_claim,
                queue=queue,
                limit=limit,
                lazy=lazy,
                **self._fence(done),
            )
        except asyncpg.UniqueViolationError:
            # The claim half met a policy index (as in claim): nothing was written. Write the
            # completions alone, then claim one per key, as claim does after such a refusal.
            lost = await self.complete_lost(done, lazy=lazy)
            return await self.claim(queue, limit, one_per_key=True), lost
        lost = set(rows[0]["lost"])
        if rows[0]["id"] is None:  # nothing claimed: the one row carries only "lost"
            return [], lost
        return _ordered(_claimed(queue, rows, 1)), lost

    async def complete(self, jobs: Sequence[ClaimedJob]) -> set[int]:
        """Complete ``jobs``; return the ids that still matched their claim (the others were
        rescued or expired meanwhile and are left as they are)."""
        if not jobs:
            return set()
        rows = await db.fetch(self.pool, self.sql.complete, **self._fence(jobs))
        return {row["id"] for row in rows}

    async def complete_lost(self, jobs: Sequence[ClaimedJob], *, lazy: bool = False) -> set[int]:
        """Complete ``jobs``; return the ids that did NOT match their claim (rescued or expired
        meanwhile, left as they are). Cheaper than :meth:`complete` for large batches.
        ``lazy``: the commit does not wait for the WAL flush."""
        if not jobs:
            return set()
        lost = await db.fetchval(self.pool, self.sql.complete_lost, lazy=lazy, **self._fence(jobs))
        return set(lost)

    async def complete_again(self, fence: Fence) -> int:
        """Write completions once more, not lazily (their first, lazy commit may have been
        lost; this one waits for the disk unless the role's own synchronous_commit is off);
        return how many matched, i.e. had been lost. One already written matches nothing: it is
        no longer active."""
        lost = await db.fetchval(self.pool, self.sql.complete_lost, lazy=False, **self._bind(fence))
        return len(fence.ids) - len(lost)

    async def fail(
        self,
        failures: Sequence[tuple[ClaimedJob, str]],
        *,
        owners: Sequence[UUID] | None = None,
        final: Collection[int] = (),
    ) -> list[FailOutcome]:
        """Record failed attempts (retry, or failed plus dead-letter copy); return what matched.

        The jobs whose ids are in ``final`` fail for good whatever retries they have left (data
        that can never succeed): state failed and the dead-letter copy, exactly as an exhausted
        job, in the same statement and behind the same fences as the others.
        """
        if not failures:
            return []
        owner_list = list(owners) if owners is not None else [self.owner] * len(failures)
        rows = await db.fetch(
            self.pool,
            self.sql.fail,
            ids=[job.id for job, _ in failures],
            attempts=[job.attempt for job, _ in failures],
            owners=owner_list,
            errors=[storable_text(error[:2000]) for _, error in failures],
            claims=[job.claim for job, _ in failures],
            finals=[job.id in final for job, _ in failures] if final else [False] * len(failures),
        )
        return [FailOutcome(row["id"], row["queue"], row["state"]) for row in rows]

    async def states(self, ids: Sequence[int]) -> dict[int, str]:
        """The state of each of these jobs now (ids whose row is gone are absent)."""
        rows = await db.fetch(self.pool, self.sql.job_states, ids=list(ids))
        return {row["id"]: row["state"] for row in rows}

    async def hand_back(self, jobs: Sequence[ClaimedJob]) -> set[int]:
        """Return claimed jobs to the queue, due at once, without counting a failure."""
        if not jobs:
            return set()
        rows = await db.fetch(self.pool, self.sql.hand_back, **self._fence(jobs))
        return {row["id"] for row in rows}

    async def hand_back_unanswered(
        self, queue: str, since: bytes | None, kept: Sequence[bytes]
    ) -> list[int]:
        """Hand back the active jobs of ``queue`` this worker holds that no claim it heard back
        from took: claimed after instant ``since`` (None: any) and by none of the claims of
        instants ``kept``. Only with no claim of the queue in flight (see the statement)."""
        rows = await db.fetch(
            self.pool,
            self.sql.hand_back_unanswered,
            queue=queue,
            since=since,
            kept=list(kept),
            owner=self.owner,
        )
        return [row["id"] for row in rows]

    def _fence(self, jobs: Sequence[ClaimedJob]) -> dict[str, Any]:
        """The fence parameters of a batched write: ids, attempts, claim instants, owner."""
        return self._bind(Fence.of(jobs))

    def _bind(self, fence: Fence) -> dict[str, Any]:
        return {
            "ids": fence.ids,
            "attempts": fence.attempts,
            "claims": fence.claims,
            "owner": self.owner,
        }


def storable_text(text: str) -> str:
    """``text`` as PostgreSQL can store it: surrogate pairs joined into their character, a lone
    surrogate (which UTF-8 cannot encode) replaced by U+FFFD, and NUL (which text cannot hold)
    removed."""
    if text.isascii():
        return text.replace("\x00", "")
    joined = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return joined.replace("\x00", "")


def _claimed(queue: str, rows: list[asyncpg.Record], skip: int) -> list[ClaimedJob]:
    """The jobs of a claim's rows, whose job columns follow ``skip`` others. By position when
    the columns are :data:`JOB_COLUMNS` in order (checked once per batch), else by name."""
    if not rows:
        return []
    if tuple(rows[0].keys())[skip:] != JOB_COLUMNS:
        return [ClaimedJob.from_row(queue, row) for row in rows]
    from_values = ClaimedJob.from_values
    if skip:
        return [from_values(queue, tuple(row)[skip:]) for row in rows]
    return [from_values(queue, tuple(row)) for row in rows]


_ID = attrgetter("id")
_PRIORITY = attrgetter("priority")


def _ordered(jobs: list[ClaimedJob]) -> list[ClaimedJob]:
    """Priority, then id order (UPDATE ... RETURNING promises no order): by id, then by
    priority, highest first (a stable sort keeps the id order among equals; two sorts on C
    keys cost less than one on a tuple built per job)."""
    if len(jobs) > 1:
        jobs.sort(key=_ID)
        jobs.sort(key=_PRIORITY, reverse=True)
    return jobs
