"""Rescue of jobs whose worker died, expiry, and retention pruning; one replica at a time."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable

import anyio
import asyncpg
import structlog

from ..db import statements as db
from ..db.connections import RETRYABLE_ERRORS, TRANSIENT_ERRORS
from ..db.locks import MAINTENANCE, try_xact_lock
from ..metrics import JOBS_RESCUED
from .availability import Availability
from .jobs import ClaimedJob
from .sql import QueueStatements
from .store import JobStore

log = structlog.get_logger("worker.maintenance")

#: Rows per rescue and per prune statement, and prune statements per run: every statement
#: stays short, and a backlog is worked off over successive runs.
RESCUE_BATCH = 1000
PRUNE_BATCH = 2000
PRUNE_BUDGET_SECONDS = 2.0
#: A (queue, state) keeps up to this many counter rows before a prune pass folds them (about
#: as many as write to it at once: fewer would only be split again).
COMPACT_KEEP = 4


class Maintenance:
    """Runs when the probe asks: at once for a rescue, at most every ``interval`` seconds for
    pruning. An idle database triggers nothing, so an idle worker writes nothing here.

    Each run takes a transaction-level try-lock first: one replica works, the others skip.
    A replica rescues nothing until it has had ``stale_seconds`` of database without a break
    (``availability``): after an outage the other replicas' heartbeats are as old as a dead
    worker's, and they get that long to beat again before this one judges them dead.
    """

    def __init__(
        self,
        store: JobStore,
        sql: QueueStatements,
        schema: str,
        *,
        interval: float,
        stale_seconds: float,
        own_beat: Callable[[], Awaitable[None]] | None = None,
        availability: Availability | None = None,
    ) -> None:
        self._store = store
        self._own_beat = own_beat
        self._availability = availability
        self._deferred = False
        self._pool = store.pool
        self._sql = sql
        self._schema = schema
        self._interval = interval
        self._stale = stale_seconds
        self._wake = anyio.Event()
        self._prune_wanted = False
        self._last_prune = -float("inf")

    def trigger_rescue(self) -> None:
        """A job needs rescuing: run as soon as possible."""
        self._wake.set()

    def trigger_prune(self) -> None:
        """Finished jobs may be past retention: prune, at most once per interval."""
        self._prune_wanted = True
        if time.monotonic() - self._last_prune >= self._interval:
            self._wake.set()

    async def run(self) -> None:
        """Run passes when triggered, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            prune = self._prune_wanted and time.monotonic() - self._last_prune >= self._interval
            try:
                await self.run_once(prune=prune)
            except RETRYABLE_ERRORS as exc:
                if isinstance(exc, TRANSIENT_ERRORS) and self._availability is not None:
                    self._availability.lost()
                log.warning("maintenance.failed", error=f"{type(exc).__name__}: {exc}")
            except Exception:
                log.exception("maintenance.error")
            if prune:
                self._prune_wanted = False
                self._last_prune = time.monotonic()

    async def run_once(self, *, prune: bool = True) -> tuple[int, int]:
        """One pass: rescue, then (optionally) prune. Returns (rescued, pruned); (0, 0) when
        another replica holds the lock. The rescue is skipped while this process has had its
        database for less than the stale limit."""
        rescue = self._may_judge()
        if not rescue and not prune:
            return 0, 0
        if rescue and self._own_beat is not None:
            # This process is alive: record it before judging which workers are not. After an
            # outage or a read-only spell longer than the stale limit, its own heartbeat is as
            # old as a dead worker's, and it would rescue its own running jobs. If the beat
            # cannot be written, neither could a rescue: the pass fails and is retried.
            await self._own_beat()
        async with self._pool.acquire() as conn, conn.transaction():
            if not await try_xact_lock(conn, MAINTENANCE, self._schema):
                return 0, 0
            candidates = (
                await db.fetch(
                    conn,
                    self._sql.rescue_candidates,
                    stale_seconds=self._stale,
                    limit=RESCUE_BATCH,
                )
                if rescue
                else []
            )
        rescued = await self.rescue(candidates)
        pruned = await self._prune() if prune else 0
        if rescued or pruned:
            log.info("maintenance.ran", rescued=rescued, pruned=pruned)
        return rescued, pruned

    def _may_judge(self) -> bool:
        """Whether this process has had its database long enough to judge other workers dead."""
        if self._availability is None:
            return True
        available = self._availability.seconds()
        if available >= self._stale:
            self._deferred = False
            return True
        if not self._deferred:
            self._deferred = True
            log.info(
                "maintenance.rescue_deferred",
                available_seconds=round(available, 1),
                stale_seconds=self._stale,
                hint="the database was unreachable lately: other workers get a full stale"
                " interval to beat before their jobs are rescued",
            )
        return False

    async def rescue(self, rows: list[asyncpg.Record]) -> int:
        """Fail each rescue candidate (a row of ``rescue_candidates``) as an attempt, fenced on
        its owner, attempt and claim instant; return how many still matched."""
        if not rows:
            return 0
        failures = []
        owners = []
        reasons: Counter[tuple[str, str]] = Counter()
        for row in rows:
            job = ClaimedJob(
                id=row["id"],
                queue=row["queue"],
                attempt=row["attempt"],
                retry_count=0,
                retry_limit=0,
                singleton_key=None,
                expire_seconds=1,
                priority=0,
                raw_data=None,
                claim=row["claim"],
            )
            failures.append((job, f"rescued: {row['reason']}"))
            owners.append(row["locked_by"] or uuid.UUID(int=0))
        outcomes = await self._store.fail(failures, owners=owners)
        matched = {o.id for o in outcomes}
        for row in rows:
            if row["id"] in matched:
                reasons[(row["queue"], row["reason"])] += 1
                log.warning(
                    "job.rescued",
                    job_id=row["id"],
                    queue=row["queue"],
                    attempt=row["attempt"],
                    reason=row["reason"],
                    worker_id=str(row["locked_by"]),
                )
        for (queue, reason), n in reasons.items():
            JOBS_RESCUED.labels(queue, reason).inc(n)
        return len(matched)

    async def _prune(self) -> int:
        min_retention = await db.fetchval(self._pool, self._sql.min_retention)
        deadline = time.monotonic() + PRUNE_BUDGET_SECONDS
        total = 0
        while time.monotonic() < deadline:
            status = await db.execute(
                self._pool,
                self._sql.prune,
                min_retention=float(min_retention),
                limit=PRUNE_BATCH,
            )
            deleted = int(status.split()[-1])
            total += deleted
            if deleted < PRUNE_BATCH:
                break
        await db.execute(self._pool, self._sql.prune_workers)
        # Every counter row comes from a job entering or leaving a finished state, and finished
        # jobs become prunable after their retention: folding here bounds the rows.
        await db.fetchval(self._pool, self._sql.compact_counts, keep=COMPACT_KEEP)
        return total
