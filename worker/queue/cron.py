"""Cron: each tick of a schedule enqueues exactly one job, decided by the database.

Replicas only decide when to look. Which slot is due comes from the database clock, and the
slot is claimed by a compare-and-set on the schedule row (FIRE_SCHEDULE), so any number of
replicas, with any clock skew, enqueue one job per tick. A slot missed while every worker was
down is simply the newest past slot at the next boot: it fires once, not once per missed tick.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import anyio
import asyncpg
import structlog
from croniter import croniter

from ..db.connections import RETRYABLE_ERRORS, TRANSIENT_ERRORS, backoff_delay
from .availability import Availability
from .sql import QueueStatements

log = structlog.get_logger("worker.cron")

#: Without a change notification, schedules are re-read this often (seconds).
RELOAD_SECONDS = 300.0
_EPSILON = timedelta(microseconds=1)


def _iterator(cron: str, tz: str, at: datetime) -> croniter:
    return croniter(cron, at.astimezone(ZoneInfo(tz)), second_at_beginning=len(cron.split()) == 6)


def latest_slot(cron: str, tz: str, now: datetime) -> datetime:
    """The newest tick of ``cron`` at or before ``now``."""
    slot: datetime = _iterator(cron, tz, now + _EPSILON).get_prev(datetime)
    return slot


def next_slot(cron: str, tz: str, now: datetime) -> datetime:
    """The first tick of ``cron`` strictly after ``now``."""
    slot: datetime = _iterator(cron, tz, now).get_next(datetime)
    return slot


@dataclass(frozen=True, slots=True)
class _Row:
    queue: str
    cron: str
    tz: str
    last_slot: datetime


class CronScheduler:
    """Fires the schedules of this process's queues at their ticks."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        sql: QueueStatements,
        queues: list[str],
        *,
        availability: Availability | None = None,
    ) -> None:
        self._availability = availability or Availability()
        self._pool = pool
        self._sql = sql
        self._queues = queues
        self._changed = anyio.Event()

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

    async def tick(self) -> float:
        """Fire every due schedule once; return seconds until the next tick to look at."""
        rows = await self._pool.fetch(self._sql.load_schedules, self._queues)
        if not rows:
            return RELOAD_SECONDS
        db_now: datetime = rows[0]["db_now"]
        sleep = RELOAD_SECONDS
        for record in rows:
            row = _Row(record["queue"], record["cron"], record["tz"], record["last_slot"])
            slot = latest_slot(row.cron, row.tz, db_now)
            if slot > row.last_slot:
                await self.fire(row.queue, row.cron, slot)
            until = (next_slot(row.cron, row.tz, db_now) - db_now).total_seconds()
            sleep = min(sleep, until)
        # Wake a hair after the tick so the database clock has passed it too.
        return max(0.0, sleep) + 0.002

    async def fire(self, queue: str, cron: str, slot: datetime) -> int | None:
        """Enqueue ``slot`` of ``queue`` unless another replica already has; return the job id."""
        row = await self._pool.fetchrow(self._sql.fire_schedule, queue, slot, cron)
        assert row is not None
        if row["moved"]:
            log.info("cron.fired", queue=queue, slot=slot.isoformat(), job_id=row["id"])
            job_id: int | None = row["id"]
            return job_id
        return None
