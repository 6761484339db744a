"""Cron: each tick of a schedule enqueues exactly one job, decided by the database.

Replicas only decide when to look. Which slot is due comes from the database clock, and the
slot is claimed by a compare-and-set on the schedule row (FIRE_SCHEDULE), so any number of
replicas, with any clock skew, enqueue one job per tick. A slot missed while every worker was
down is simply the newest past slot at the next boot: it fires once, not once per missed tick.

Ticks follow the wall clock of CRON_TZ the way cron(8) does across daylight-saving changes. A
cron at fixed times (neither its minute nor its hour field starts with ``*``) ticks once per
wall-clock time: in the hour that repeats when clocks go back, the second 01:30 is not a new
tick; a time skipped when clocks go forward fires once, when the clocks reach the next hour. A
cron with a ``*`` minute or hour (hourly, every 5 minutes) keeps ticking every real hour or
minute through both changes, so it has no gap and, in the repeated hour, ticks twice at the
same wall time. Slots are UTC instants computed from the cron, the zone and the clock alone,
so every replica computes the same ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import anyio
import asyncpg
import structlog
from croniter import croniter

from ..db import statements as db
from ..db.connections import RETRYABLE_ERRORS, TRANSIENT_ERRORS, backoff_delay
from ..settings import cron_fields
from .availability import Availability
from .sql import QueueStatements

log = structlog.get_logger("worker.cron")

#: Without a change notification, schedules are re-read this often (seconds).
RELOAD_SECONDS = 300.0
_EPSILON = timedelta(microseconds=1)


#: Ticks one lookup may step over: the repeated hour of a per-second fixed-time cron, with room.
_MAX_SKIPPED = 100_000


def _iterator(cron: str, zone: ZoneInfo, at: datetime) -> croniter:
    return croniter(cron, at.astimezone(zone), second_at_beginning=len(cron.split()) == 6)


def _fixed_times(cron: str) -> bool:
    """Whether ``cron`` names fixed wall-clock times: neither its minute nor its hour field
    starts with ``*`` (cron(8)'s test for a job it runs once across a clock change)."""
    fields = cron.split()
    # 5 fields start with the minute; 6 with the seconds, then the minute.
    minute, hour = fields[-5], fields[-4]
    return not (minute.startswith("*") or hour.startswith("*"))


def _repeated(slot: datetime, zone: ZoneInfo) -> bool:
    """Whether ``slot`` is the second occurrence of its wall-clock time (clocks went back)."""
    wall = slot.astimezone(zone).replace(tzinfo=None)
    return wall.replace(tzinfo=zone, fold=0).astimezone(UTC) < slot


def _step(cron: str, tz: str, at: datetime, *, forward: bool) -> datetime:
    zone = ZoneInfo(tz)
    skip_repeats = _fixed_times(cron)
    ticks = _iterator(cron, zone, at)
    for _ in range(_MAX_SKIPPED):
        found: datetime = ticks.get_next(datetime) if forward else ticks.get_prev(datetime)
        # UTC: an aware local time in a repeated hour compares unequal to every other zone's.
        slot = found.astimezone(UTC)
        if not (skip_repeats and _repeated(slot, zone)):
            return slot
    raise RuntimeError(f"cron {cron!r} in {tz}: no tick within {_MAX_SKIPPED} steps of {at}")


def latest_slot(cron: str, tz: str, now: datetime) -> datetime:
    """The newest tick of ``cron`` at or before ``now``, in UTC."""
    return _step(cron, tz, now + _EPSILON, forward=False)


def next_slot(cron: str, tz: str, now: datetime) -> datetime:
    """The first tick of ``cron`` strictly after ``now``, in UTC."""
    return _step(cron, tz, now, forward=True)


@dataclass(frozen=True, slots=True)
class _Row:
    queue: str
    cron: str
    tz: str


def schedule_problem(cron: str, tz: str) -> str | None:
    """Why a schedule row's ``cron`` and ``tz`` cannot be evaluated, or ``None`` when they can.

    The row is read from the database, where any role that may write the table can put
    anything: what does not parse is reported, never raised into the scheduler."""
    try:
        cron_fields(cron)
    except ValueError as exc:
        return str(exc)
    try:
        ZoneInfo(tz)
    except (ValueError, KeyError, OSError):  # ZoneInfoNotFoundError is a KeyError
        return "unknown time zone"
    return None


class CronScheduler:
    """Fires the schedules of this process's queues at their ticks."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        sql: QueueStatements,
        queues: list[str],
        *,
        availability: Availability | None = None,
        reload_seconds: float | None = None,
    ) -> None:
        self._availability = availability or Availability()
        self._reload = RELOAD_SECONDS if reload_seconds is None else reload_seconds
        self._pool = pool
        self._sql = sql
        self._queues = queues
        self._changed = anyio.Event()
        #: Rows reported as unusable, so each is logged once (until it changes).
        self._invalid: set[_Row] = set()

    def schedules_changed(self, _payload: str = "") -> None:
        """Re-read the schedules now (an install changed them)."""
        self._changed.set()

    async def run(self) -> None:
        """Fire ticks until cancelled."""
        attempt = 0
        while True:
            self._changed = anyio.Event()
            try:
                sleep = await self.tick()
                attempt = 0
            except RETRYABLE_ERRORS as exc:
                # A tick whose statement failed is simply looked at again: the slot's
                # compare-and-set makes a retry fire it at most once.
                if isinstance(exc, TRANSIENT_ERRORS):
                    self._availability.lost()
                sleep = backoff_delay(attempt)
                attempt += 1
                log.warning(
                    "cron.failed", error=f"{type(exc).__name__}: {exc}", retry_in=round(sleep, 2)
                )
            with anyio.move_on_after(sleep):
                await self._changed.wait()

    async def tick(self, at: datetime | None = None) -> float:
        """Fire every due schedule once; return seconds until the next tick to look at.

        ``at`` stands in for the database clock (tests walk a schedule through a chosen day).
        """
        rows = await db.fetch(self._pool, self._sql.load_schedules, queues=self._queues)
        if not rows:
            return self._reload
        db_now: datetime = rows[0]["db_now"] if at is None else at
        sleep = self._reload
        invalid: set[_Row] = set()
        for record in rows:
            row = _Row(record["queue"], record["cron"], record["tz"])
            ticks = self._ticks(row, db_now)
            if ticks is None:
                invalid.add(row)
                continue
            slot, following = ticks
            if slot > record["last_slot"]:
                await self.fire(row.queue, row.cron, slot)
            sleep = min(sleep, (following - db_now).total_seconds())
        # A row mended (or removed) since is forgotten: broken again later, it is logged again.
        self._invalid = invalid
        # Wake a hair after the tick so the database clock has passed it too.
        return max(0.0, sleep) + 0.002

    def _ticks(self, row: _Row, db_now: datetime) -> tuple[datetime, datetime] | None:
        """The newest tick of ``row`` at or before ``db_now`` and the next one after it, or
        ``None`` for a row that cannot be evaluated (logged once, then skipped)."""
        problem = schedule_problem(row.cron, row.tz)
        if problem is None:
            try:
                return latest_slot(row.cron, row.tz, db_now), next_slot(row.cron, row.tz, db_now)
            except Exception as exc:  # a cron that parses but never ticks (30 February)
                problem = f"{type(exc).__name__}: {exc}"
        if row not in self._invalid:
            log.error(
                "cron.invalid",
                queue=row.queue,
                cron=row.cron,
                tz=row.tz,
                problem=problem,
                hint="the schedule is skipped until its row is fixed or the next install",
            )
        return None

    async def fire(self, queue: str, cron: str, slot: datetime) -> int | None:
        """Enqueue ``slot`` of ``queue`` unless another replica already has; return the job id."""
        row = await db.fetchrow(
            self._pool, self._sql.fire_schedule, queue=queue, slot=slot, cron=cron
        )
        assert row is not None
        if row["moved"]:
            log.info("cron.fired", queue=queue, slot=slot.isoformat(), job_id=row["id"])
            job_id: int | None = row["id"]
            return job_id
        return None
