"""Queue counts with 5 million retained jobs (issue 10 part D, contract section 9).

One scratch database is filled once with ``BENCH_RETAINED_JOBS`` jobs (5,000,000): 200,000 of
them waiting (created and retry, a tenth due in an hour), 1,000 active (held by a worker whose
heartbeat stays fresh), the rest finished (completed, 2% cancelled, 2% failed, finished within
the last half hour so nothing is past retention while this runs), over five queues, among them
the drain's. The fill is set-based (``INSERT ... SELECT generate_series``) with the counting
triggers off, followed by ``job_count_reset()`` (timed: it is what migration 0005 does on a
database that already holds jobs) and ``VACUUM ANALYZE`` (autovacuum may be off).

Then, ``RUNS`` times:

* ``chassis-worker queues --json``: the whole command (process start included), timed;
* ``GET /metrics`` of a real worker process, three scrapes each more than
  ``MIN_REFRESH_SECONDS`` after the last (so each one counts afresh), the slowest one timed; one
  more finished job is inserted before each, and the scrape must show it (fresh, not cached);
* the drain of 60,000 no-op jobs (as ``benchmarks.drain``) on this database, and on an empty
  one, in alternating order.

Run it alone with ``python -m benchmarks.counts``; ``make bench`` runs it after the queue figures.
It adds about five minutes (the fill is most of it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass

import anyio
import asyncpg

from tests.support.processes import base_env
from worker.declarations import JobDeclaration, QueueOptions
from worker.gauges import MIN_REFRESH_SECONDS
from worker.logging import configure_logging
from worker.queue.sql import render as render_sql

from . import drain
from .common import RUNS, install_queues, scratch_database, start_worker
from .console import console_figures
from .noop import DRAIN, DRAIN_QUEUE, noop
from .report import Row, measured, render

RETAINED = int(os.environ.get("BENCH_RETAINED_JOBS", "5000000"))
WAITING = int(os.environ.get("BENCH_WAITING_JOBS", "200000"))
ACTIVE = 1_000
SCRAPES = 3

#: The queues that hold the retained jobs and nothing consumes, and the drain's own.
RETAINED_QUEUES = [f"bench-retained-{i}" for i in range(1, 5)]
FINISHED_QUEUES = [*RETAINED_QUEUES, DRAIN_QUEUE]
DECLARATIONS = [
    *DRAIN,
    *(
        JobDeclaration(queue=q, handler=noop, options=QueueOptions(retention_seconds=7200))
        for q in RETAINED_QUEUES
    ),
]
#: The worker row that holds the active jobs: its heartbeat is a day ahead, so no rescue.
HOLDER = uuid.UUID(int=7)

#: Finished jobs over every queue (the drain's too), finished within the last half hour.
FILL_FINISHED = """
INSERT INTO jobs.job (queue, state, data, retry_limit, retry_delay, retry_backoff,
                      expire_seconds, created_at, started_at, completed_at, attempt)
SELECT ($2::text[])[1 + g % cardinality($2::text[])],
       CASE WHEN g % 50 = 0 THEN 'failed' WHEN g % 50 = 1 THEN 'cancelled'
            ELSE 'completed' END::jobs.job_state,
       jsonb_build_object('n', g), 2, 0, false, 900,
       now() - interval '40 minutes', now() - interval '35 minutes',
       now() - (g % 1800) * interval '1 second', 1
FROM generate_series(1, $1) g
"""

#: Waiting jobs of the unconsumed queues: 5% waiting for a retry, a tenth due in an hour.
FILL_WAITING = """
INSERT INTO jobs.job (queue, state, data, retry_limit, retry_delay, retry_backoff,
                      expire_seconds, start_after, retry_count)
SELECT ($2::text[])[1 + g % cardinality($2::text[])],
       CASE WHEN g % 20 = 0 THEN 'retry' ELSE 'created' END::jobs.job_state,
       jsonb_build_object('n', g), 2, 0, false, 900,
       now() - (g % 600) * interval '1 second'
           + CASE WHEN g % 10 = 0 THEN interval '1 hour' ELSE interval '0' END,
       CASE WHEN g % 20 = 0 THEN 1 ELSE 0 END
FROM generate_series(1, $1) g
"""

FILL_ACTIVE = """
WITH holder AS (
    INSERT INTO jobs.worker (id, host, pid, heartbeat_at)
    VALUES ($3, 'bench', 0, now() + interval '1 day')
)
INSERT INTO jobs.job (queue, state, data, retry_limit, retry_delay, retry_backoff,
                      expire_seconds, started_at, locked_by, attempt)
SELECT ($2::text[])[1 + g % cardinality($2::text[])], 'active', '{}', 2, 0, false, 86400,
       now(), $3, 1
FROM generate_series(1, $1) g
"""

#: One more finished job before a scrape, which that scrape must count.
ONE_MORE = """
INSERT INTO jobs.job (queue, state, retry_limit, retry_delay, retry_backoff, expire_seconds,
                      completed_at)
VALUES ($1, 'completed', 0, 0, false, 900, now())
"""

COMPLETED = "SELECT sum(n) FROM jobs.job_count WHERE queue = $1 AND state = 'completed'"

SPAN_SINCE = """
SELECT count(*) AS done,
       extract(epoch FROM max(completed_at) - min(started_at))::float8 AS seconds
FROM jobs.job WHERE queue = $1 AND id > $2 AND state = 'completed'
"""


@dataclass(frozen=True, slots=True)
class FillResult:
    """How the retained database was made."""

    fill_seconds: float
    recount_seconds: float
    recounted: int
    vacuum_seconds: float
    table_bytes: int


async def fill_retained(url: str) -> FillResult:
    """Install the queues and insert the retained jobs, then recount and vacuum."""
    await install_queues(url, DECLARATIONS)
    conn = await asyncpg.connect(url)
    try:
        started = time.perf_counter()
        async with conn.transaction():
            # The counting trigger counts inserted finished jobs row by row; a bulk fill is
            # counted once below instead, as a restore would be. Transactional: no other
            # session ever sees the trigger off.
            await conn.execute("ALTER TABLE jobs.job DISABLE TRIGGER job_count_insert")
            await conn.execute(FILL_WAITING, WAITING, RETAINED_QUEUES)
            await conn.execute(FILL_ACTIVE, ACTIVE, RETAINED_QUEUES, HOLDER)
            await conn.execute(FILL_FINISHED, RETAINED - WAITING - ACTIVE, FINISHED_QUEUES)
            await conn.execute("ALTER TABLE jobs.job ENABLE TRIGGER job_count_insert")
        filled = time.perf_counter()
        recounted = await conn.fetchval("SELECT jobs.job_count_reset()")
        recount = time.perf_counter() - filled
        started_vacuum = time.perf_counter()
        await conn.execute("VACUUM ANALYZE jobs.job")
        await conn.execute("ANALYZE jobs.queue")
        vacuum = time.perf_counter() - started_vacuum
        size = await conn.fetchval("SELECT pg_total_relation_size('jobs.job')")
    finally:
        await conn.close()
    return FillResult(filled - started, recount, int(recounted), vacuum, int(size))


def queues_seconds(url: str) -> float:
    """Wall time of ``chassis-worker queues --json`` (a new process, as an operator runs it);
    checks that it reports the retained jobs."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "worker", "queues", "--json"],
        env=base_env(url, fast=False),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"queues exited {done.returncode}: {done.stderr[-2000:]}")
    queues = {q["name"]: q for q in json.loads(done.stdout)["queues"]}
    total = sum(sum(q["counts"].values()) for q in queues.values())
    if total < RETAINED:
        raise RuntimeError(f"queues reported {total} jobs, expected at least {RETAINED}")
    return seconds


async def count_statement_seconds(url: str) -> float:
    """The count statement alone, run as the gauges run it (read-only, jit off)."""
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction(readonly=True):
            await conn.execute("SET LOCAL jit = off")
            started = time.perf_counter()
            await conn.fetch(render_sql("jobs").counts.text)
            return time.perf_counter() - started
    finally:
        await conn.close()


def scrape_value(text: str, queue: str, state: str) -> float | None:
    """``queue_jobs{queue, state}`` in a scrape."""
    prefix = f'queue_jobs{{queue="{queue}",state="{state}"}} '
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return None


async def scrape_seconds(url: str) -> tuple[float, int]:
    """The slowest of ``SCRAPES`` scrapes of a real worker, each due to count afresh, and how
    many of them did not yet show the finished job inserted just before (a count that took
    longer than the scrape's budget: the answer is fast, but its gauges are older)."""
    daemon = start_worker(url, "benchmarks.noop:DRAIN")
    conn = await asyncpg.connect(url)
    queue = RETAINED_QUEUES[0]
    try:
        await anyio.to_thread.run_sync(daemon.wait_ready, 120.0)
        await anyio.to_thread.run_sync(daemon.get, "/metrics", 30.0)  # opens the pool's connection
        slowest, stale = 0.0, 0
        for _ in range(SCRAPES):
            await anyio.sleep(MIN_REFRESH_SECONDS + 0.5)
            await conn.execute(ONE_MORE, queue)
            expected = float(await conn.fetchval(COMPLETED, queue))
            started = time.perf_counter()
            status, text = await anyio.to_thread.run_sync(daemon.get, "/metrics", 30.0)
            slowest = max(slowest, time.perf_counter() - started)
            if status != 200:
                raise RuntimeError(f"/metrics answered {status}")
            if scrape_value(text, queue, "completed") != expected:
                stale += 1
        return slowest, stale
    finally:
        await conn.close()
        daemon.stop()


async def drain_retained(url: str) -> float:
    """Jobs/s of the 60,000-job drain on the retained database (as ``drain.drain_once``)."""
    conn = await asyncpg.connect(url)
    try:
        last = await conn.fetchval("SELECT COALESCE(max(id), 0) FROM jobs.job")
        await drain.fill(url, drain.DRAIN_JOBS)
        await conn.execute("VACUUM ANALYZE jobs.job")
        daemon = start_worker(url, "benchmarks.noop:DRAIN")
        try:
            await drain.wait_finished(conn, DRAIN_QUEUE, drain.DRAIN_TIMEOUT)
        finally:
            daemon.stop()
        row = await conn.fetchrow(SPAN_SINCE, DRAIN_QUEUE, last)
    finally:
        await conn.close()
    if row["done"] != drain.DRAIN_JOBS:
        raise RuntimeError(f"drain completed {row['done']} of {drain.DRAIN_JOBS} jobs")
    return float(drain.DRAIN_JOBS / row["seconds"])


def _progress(message: str) -> None:
    """One line per finished step, with the load average (how busy the shared cores were)."""
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"  {time.strftime('%H:%M:%S')} {message} [load {load}]", flush=True)


async def measure() -> list[Row]:
    """Fill once, then every figure ``RUNS`` times; the summary rows."""
    queues, scrapes, counts, with_rows, without_rows = [], [], [], [], []
    stale = 0
    async with scratch_database("counts") as url:
        fill = await fill_retained(url)
        _progress(
            f"filled {RETAINED:,} jobs ({WAITING:,} waiting) in {fill.fill_seconds:.0f} s,"
            f" {fill.table_bytes / 2**30:.2f} GiB; job_count_reset() {fill.recount_seconds:.1f} s"
            f" ({fill.recounted:,} finished); VACUUM ANALYZE {fill.vacuum_seconds:.0f} s"
        )
        for run in range(RUNS):
            queues.append(await anyio.to_thread.run_sync(queues_seconds, url))
            counts.append(await count_statement_seconds(url))
            slowest, late = await scrape_seconds(url)
            scrapes.append(slowest)
            stale += late
            if run % 2 == 0:
                with_rows.append(await drain_retained(url))
                without_rows.append((await drain.drain_once()).rate)
            else:
                without_rows.append((await drain.drain_once()).rate)
                with_rows.append(await drain_retained(url))
            _progress(
                f"run {run + 1}: scrape {scrapes[-1]:.3f} s ({late} of {SCRAPES} not fresh yet),"
                f" queues --json {queues[-1]:.2f} s"
                f" (the statement {counts[-1] * 1000:.0f} ms); drain {with_rows[-1]:,.0f} jobs/s"
                f" among the retained rows, {without_rows[-1]:,.0f} on an empty database"
            )
        with tempfile.TemporaryDirectory(prefix="bench-console-") as log_dir:
            console_rows = await console_figures(
                url,
                RETAINED_QUEUES[0],
                lambda: drain_retained(url),
                log_dir,
                f"{RETAINED:,} jobs",
            )
        _progress("console figures done")
    retained = f"{RETAINED:,} retained jobs ({WAITING:,} waiting)"
    ratios = [a / b for a, b in zip(with_rows, without_rows, strict=True)]
    fresh = f"{RUNS * SCRAPES - stale} of {RUNS * SCRAPES} fresh"
    return [
        measured(
            f"/metrics scrape, {retained}, counting afresh (slowest of {SCRAPES}; {fresh})",
            scrapes,
            "s",
            "< 1 s, fresh",
            lambda v: v < 1.0 and stale == 0,
            digits=3,
            peer="4-6.7 s before (issue 10)",
        ),
        measured(
            "chassis-worker queues --json, same database (process start included)",
            queues,
            "s",
            "< 2 s",
            lambda v: v < 2.0,
            digits=2,
            peer="3.7 s before (issue 10)",
        ),
        measured("the count statement alone, same database", counts, "s", "-", None, digits=3),
        measured(
            f"drain 60,000 no-op jobs among the {RETAINED:,} retained",
            with_rows,
            "jobs/s",
            "-",
            None,
        ),
        measured(
            "drain 60,000 no-op jobs, empty database, same sitting",
            without_rows,
            "jobs/s",
            "-",
            None,
        ),
        measured("drain ratio with / without the retained jobs", ratios, "x", "-", None, digits=2),
        Row(
            f"job_count_reset() on {RETAINED:,} jobs (migration 0005 on a full database;"
            " writes wait meanwhile)",
            "-",
            f"{fill.recount_seconds:.1f} s",
            None,
            f"[{fill.recount_seconds:.1f}]",
        ),
        *console_rows,
    ]


def main() -> list[Row]:
    """Measure and print the rows (``make bench`` collects them into its summary)."""
    rows = anyio.run(measure, backend_options={"use_uvloop": True})
    print(render(rows, []))
    return rows


if __name__ == "__main__":
    configure_logging("warning", "console")
    main()
