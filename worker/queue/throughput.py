"""The per-minute tally of finished jobs behind the console's chart.

Only a process that has finished jobs since its last tally tallies (an idle worker writes and
reads nothing here), at most every :data:`TALLY_SECONDS`, one replica at a time.
"""

from __future__ import annotations

import time

import anyio
import asyncpg
import structlog

from api_sender.query import Query

from ..db import statements as db
from ..db.connections import RETRYABLE_ERRORS
from ..db.locks import THROUGHPUT, try_xact_lock

log = structlog.get_logger("worker.throughput")

#: How often a busy process brings the tally up to date (seconds): the chart lags at most this.
TALLY_SECONDS = 15.0

TALLY = Query(
    "tally_minutes",
    """
-- throughput tally: recount every minute from the one before the newest tallied minute (a
-- completion's completed_at is its transaction's start, so a commit can land in a minute already
-- counted) up to now, through job_finished (a range of the last minute or two of finished rows),
-- in minute order (two tallies never wait on each other in a cycle). Unchanged minutes are not
-- rewritten. Without any tally yet, it starts an hour back.
WITH since AS (
    SELECT COALESCE((SELECT max(minute) FROM {s}.job_minute) - interval '1 minute',
                    date_trunc('minute', now()) - interval '59 minutes') AS t
), counted AS (
    SELECT date_trunc('minute', j.completed_at) AS minute,
           count(*) FILTER (WHERE j.state = 'completed') AS completed,
           count(*) FILTER (WHERE j.state = 'failed') AS failed
    FROM {s}.job j, since
    WHERE j.state > 'active' AND j.completed_at >= since.t
    GROUP BY 1
    ORDER BY 1
), written AS (
    INSERT INTO {s}.job_minute AS m (minute, completed, failed)
    SELECT minute, completed, failed FROM counted
    ON CONFLICT (minute) DO UPDATE SET completed = EXCLUDED.completed, failed = EXCLUDED.failed
    WHERE (m.completed, m.failed) IS DISTINCT FROM (EXCLUDED.completed, EXCLUDED.failed)
    RETURNING 1
)
SELECT count(*) AS written FROM written
""",
)

FORGET_OLD = Query(
    "forget_old_minutes",
    """
-- throughput tally (worker role only: the api role has no DELETE): minutes older than a day.
DELETE FROM {s}.job_minute WHERE minute < now() - interval '1 day'
""",
)

LAST_HOUR = Query(
    "last_hour",
    """
-- console chart: the tallied minutes of the last hour, and how old the newest tally is.
SELECT minute, completed, failed, date_trunc('minute', now()) AS now_minute,
       now() - (SELECT max(minute) FROM {s}.job_minute) AS newest_age
FROM {s}.job_minute
WHERE minute >= date_trunc('minute', now()) - interval '59 minutes'
ORDER BY minute
""",
)


async def tally(conn: asyncpg.Connection, schema: str, *, forget: bool) -> int | None:
    """Bring the tally up to date in one transaction, unless another process is at it
    (``None``); how many minutes were (re)written."""
    async with conn.transaction():
        if not await try_xact_lock(conn, THROUGHPUT, schema):
            return None
        written: int = await db.fetchval(conn, TALLY.render(schema))
        if forget:
            await db.execute(conn, FORGET_OLD.render(schema))
    return written


class Tally:
    """Keeps the per-minute tally current while this process finishes jobs."""

    def __init__(self, pool: asyncpg.Pool, schema: str) -> None:
        self._pool = pool
        self._schema = schema
        self._wanted = anyio.Event()
        self._last = -float("inf")

    def finished(self) -> None:
        """Jobs finished here: tally within :data:`TALLY_SECONDS`."""
        self._wanted.set()

    async def run(self) -> None:
        """Tally when wanted, at most every :data:`TALLY_SECONDS`, until cancelled."""
        while True:
            await self._wanted.wait()
            await anyio.sleep(max(0.0, self._last + TALLY_SECONDS - time.monotonic()))
            self._wanted = anyio.Event()
            self._last = time.monotonic()
            try:
                async with self._pool.acquire() as conn:
                    await tally(conn, self._schema, forget=True)
            except RETRYABLE_ERRORS as exc:
                log.warning("throughput.tally_failed", error=f"{type(exc).__name__}: {exc}")
            except Exception:
                # Only the console's chart depends on it: never worth stopping the worker for.
                log.exception("throughput.tally_error")
