"""orphan-user-purge: users no workspace, session or invitation holds on to, deleted whole.

Each candidate is re-checked in its own short transaction against the whole rule, under locks
that make any write able to keep the user (a membership, a session, an invitation, the operator
setting, the user's own email or verification) either visible to the re-check or blocked until
the delete has committed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import asyncpg
import structlog

from ...db import statements as db
from . import sql
from .batches import BatchLimits, capped
from .runs import PurgeBody, PurgeRun, span

log = structlog.get_logger("worker.purge")

ORPHAN_LIMITS = BatchLimits(batch_size=50, max_batches=200)
#: How long one user's transaction waits for app writers of invitations and instance_settings:
#: such writes take milliseconds, and writers arriving meanwhile queue behind our request.
TABLE_LOCK_WAIT = "1s"
#: How long it waits for the user row and the rows its delete cascades to.
ROW_LOCK_WAIT = "5s"
#: Emails named in the run's audit row at most.
SAMPLE_SIZE = 20


@dataclass(frozen=True, slots=True)
class OrphanRule:
    """The settings the candidate rule depends on."""

    retention_hours: int
    #: Trimmed, lower-cased SUPERADMIN_EMAILS.
    superadmins: frozenset[str] = frozenset()
    limits: BatchLimits = ORPHAN_LIMITS


class Outcome(Enum):
    """What happened to one candidate."""

    DELETED = "deleted"
    #: The re-check under the locks found the user no longer matches the orphan rule.
    IN_USE = "in_use"
    #: Someone else deleted the user first.
    GONE = "gone"
    #: The delete raised (a trigger, a lock timeout): the user stays, the sweep goes on.
    FAILED = "failed"
    #: The app kept invitations or instance_settings write-locked past TABLE_LOCK_WAIT: the user
    #: stays and the run stops, as every later user would wait the same.
    BUSY = "busy"


class _TablesBusy(Exception):
    """The exclusion tables stayed write-locked past the wait."""


class ExclusionLockDenied(Exception):
    """The database role may not lock invitations and instance_settings, so no re-check can be
    made safe: the run fails rather than delete anyone unguarded."""


@dataclass(slots=True)
class AuditTrail:
    """The run's one instance-level audit row, written with the first deletion, then kept exact."""

    retention_hours: int
    row_id: Any = None
    deleted: int = 0
    sample: list[str] = field(default_factory=list)

    def after(self, email: str) -> dict[str, Any]:
        """The row's metadata once the user with ``email`` is deleted too."""
        sample = [*self.sample, email] if len(self.sample) < SAMPLE_SIZE else self.sample
        return {
            "deleted": self.deleted + 1,
            "retention_hours": self.retention_hours,
            "sample": sample,
        }


async def _lock_exclusion_tables(conn: asyncpg.Connection) -> None:
    try:
        await db.execute(conn, sql.LOCK_EXCLUSION_TABLES)
    except asyncpg.LockNotAvailableError as exc:
        raise _TablesBusy(str(exc)) from exc
    except asyncpg.InsufficientPrivilegeError as exc:
        raise ExclusionLockDenied(
            f"{exc}: the orphan purge needs UPDATE (or DELETE) on public.invitations and "
            "public.instance_settings, only to lock them in SHARE mode while it re-checks a user"
        ) from exc


async def delete_if_orphan(
    conn: asyncpg.Connection,
    run: PurgeRun,
    rule: OrphanRule,
    trail: AuditTrail,
    user_id: str,
    email: str,
) -> Outcome:
    """In one transaction: lock what could keep the user, re-check the whole rule at ``run.now``,
    delete the user whole and bring the run's audit row up to date, so the row never misses a
    deleted user."""
    metadata = trail.after(email)
    try:
        # READ COMMITTED whatever the database's default: each statement's snapshot is taken
        # after the lock waits before it, which is what lets the re-check see their writers.
        async with conn.transaction(isolation="read_committed"):
            await db.execute(conn, sql.USER_TRANSACTION_LIMITS, lock_wait=TABLE_LOCK_WAIT)
            await _lock_exclusion_tables(conn)
            await db.execute(conn, sql.USER_TRANSACTION_LIMITS, lock_wait=ROW_LOCK_WAIT)
            if await db.fetchval(conn, sql.LOCK_USER, user_id=user_id) is None:
                return Outcome.GONE
            still = await db.fetchval(
                conn,
                sql.STILL_ORPHAN,
                now=run.now,
                retention_hours=rule.retention_hours,
                superadmins=_superadmins(rule),
                user_id=user_id,
            )
            if not still:
                return Outcome.IN_USE
            await db.execute(conn, sql.DELETE_USER, user_id=user_id)
            if trail.row_id is None:
                row_id = await db.fetchval(
                    conn, sql.AUDIT_ORPHAN_PURGE, now=run.now, metadata=json.dumps(metadata)
                )
            else:
                row_id = trail.row_id
                await db.execute(
                    conn, sql.UPDATE_ORPHAN_AUDIT, row_id=row_id, metadata=json.dumps(metadata)
                )
    except _TablesBusy as exc:
        log.warning("purge.orphan_tables_busy", queue=run.queue, user_id=user_id, error=str(exc))
        return Outcome.BUSY
    except asyncpg.PostgresError as exc:
        log.warning(
            "purge.orphan_skipped",
            queue=run.queue,
            user_id=user_id,
            error=f"{type(exc).__name__}: {exc}",
        )
        return Outcome.FAILED
    # Committed: only now does the tally move.
    trail.row_id = row_id
    trail.deleted = metadata["deleted"]
    trail.sample = metadata["sample"]
    run.count(1)
    return Outcome.DELETED


def _superadmins(rule: OrphanRule) -> str:
    # One jsonb parameter, never a driver-serialised array, in a query that decides deletions.
    return json.dumps(sorted(rule.superadmins))


#: Awaited after each candidate scan, before its users are re-checked: the moment a race test
#: changes the database in (a test signal; production passes none).
Scanned = Callable[[], Awaitable[None]]


async def purge_orphan_users(
    conn: asyncpg.Connection, run: PurgeRun, rule: OrphanRule, scanned: Scanned | None = None
) -> None:
    """Delete every user the candidate rule selects at ``run.now``; 0 hours deletes nothing."""
    if rule.retention_hours <= 0:
        run.retention = "disabled"
        return
    run.retention = span(rule.retention_hours, "hour")
    limits = rule.limits
    superadmins = _superadmins(rule)
    trail = AuditTrail(rule.retention_hours)
    passed: list[str] = []
    outcomes = dict.fromkeys(Outcome, 0)
    batches = 0
    started = time.monotonic()
    run.drained = False
    try:
        while batches < limits.max_batches:
            if batches and time.monotonic() - started >= limits.time_budget_seconds:
                break
            cap = limits.statement_timeout_seconds
            with capped(cap, "the orphan candidate scan"):
                rows = await db.fetch(
                    conn,
                    sql.ORPHAN_CANDIDATES,
                    timeout=cap,
                    now=run.now,
                    retention_hours=rule.retention_hours,
                    superadmins=superadmins,
                    passed=json.dumps(passed),
                    limit=limits.batch_size,
                )
            batches += 1
            if scanned is not None:
                await scanned()
            progressed = 0
            for row in rows:
                outcome = await delete_if_orphan(conn, run, rule, trail, row["id"], row["email"])
                outcomes[outcome] += 1
                if outcome is Outcome.BUSY:
                    return
                if outcome is Outcome.DELETED:
                    progressed += 1
                else:
                    # Never offered again this run, so a kept user cannot fill a later batch.
                    passed.append(row["id"])
            if len(rows) < limits.batch_size:
                run.drained = True
                break
            if progressed == 0:
                break
    finally:
        run.details.update(
            batches=batches,
            kept_on_recheck=outcomes[Outcome.IN_USE],
            skipped=outcomes[Outcome.FAILED],
            tables_busy=outcomes[Outcome.BUSY] > 0,
        )


def orphan_body(rule: OrphanRule, scanned: Scanned | None = None) -> PurgeBody:
    """The orphan-user-purge body for one rule (``scanned``: see :data:`Scanned`)."""

    async def body(conn: asyncpg.Connection, run: PurgeRun) -> None:
        await purge_orphan_users(conn, run, rule, scanned)

    return body
