"""audit-purge of 1,000,000 old rows: the run's total time and its longest single statement.

A scratch database on the test server (127.0.0.1:5432 unless TEST_DATABASE_URL says otherwise)
is created, migrated, filled with 1,000,000 audit rows past a 30-day retention plus 50,000
younger ones that must survive, purged by the real audit-purge run (batches of 5,000 through the
created_at index, run record and all), and dropped. Run it with ``python -m benchmarks.purge``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta

import asyncpg

from tests.support.postgres import server_url, with_database
from worker.db.bounded import HandlerPool
from worker.db.migrations import migrate
from worker.jobs.purges import AUDIT_PURGE_QUEUE
from worker.jobs.purges.audit import audit_body
from worker.jobs.purges.runs import run_purge

OLD_ROWS = 1_000_000
YOUNG_ROWS = 50_000
RETENTION_DAYS = 30

FILL = """
INSERT INTO public.audit_log
    (workspace_id, actor_via, principal, action, resource_type, resource_id, metadata, created_at)
SELECT 'ws_' || (g % 97), 'api_key', 'key_' || (g % 1009), 'thing.read', 'thing', 'thing_' || g,
       jsonb_build_object('ip', '10.0.0.' || (g % 250), 'n', g),
       now() - $2::interval - (g % $3) * interval '1 minute'
FROM generate_series(1, $1) g
"""


@dataclass(frozen=True)
class PurgeFigures:
    """What one benchmark run measured."""

    deleted: int
    kept: int
    batches: int
    total_seconds: float
    longest_statement_seconds: float
    fill_seconds: float


async def measure(old_rows: int = OLD_ROWS, young_rows: int = YOUNG_ROWS) -> PurgeFigures:
    """Fill a scratch database, run the audit purge once, and drop the database."""
    admin_url = server_url()
    name = f"chassis_bench_purge_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        url = with_database(admin_url, name)
        conn = await asyncpg.connect(url)
        try:
            await migrate(conn, "jobs", lock_timeout=60)
            began = time.perf_counter()
            # Old rows spread over ~9 months before the cutoff, young ones over the last 2 weeks.
            await conn.execute(FILL, old_rows, timedelta(days=RETENTION_DAYS + 1), 400_000)
            await conn.execute(FILL, young_rows, timedelta(hours=1), 20_000)
            await conn.execute("VACUUM ANALYZE public.audit_log")
            fill_seconds = time.perf_counter() - began
        finally:
            await conn.close()
        pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
        try:
            began = time.perf_counter()
            run = await run_purge(
                HandlerPool(pool, 1),
                "jobs",
                AUDIT_PURGE_QUEUE,
                None,
                audit_body(RETENTION_DAYS),
                session_url=url,
            )
            total = time.perf_counter() - began
            kept = await pool.fetchval("SELECT count(*) FROM public.audit_log")
        finally:
            await pool.close()
    finally:
        admin = await asyncpg.connect(admin_url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()
    return PurgeFigures(
        deleted=run.deleted,
        kept=kept,
        batches=int(run.details["batches"]),
        total_seconds=total,
        longest_statement_seconds=float(run.details["longest_statement_seconds"]),
        fill_seconds=fill_seconds,
    )


def report(figures: PurgeFigures) -> str:
    """The benchmark's output lines."""
    rate = figures.deleted / figures.total_seconds if figures.total_seconds else 0.0
    longest_ms = figures.longest_statement_seconds * 1000
    return "\n".join(
        [
            f"audit-purge: {figures.deleted:,} rows past a {RETENTION_DAYS}-day retention "
            f"deleted in {figures.total_seconds:.2f} s ({rate:,.0f} rows/s), "
            f"{figures.batches} batches of 5,000",
            f"audit-purge: longest single statement {longest_ms:.0f} ms"
            f"; {figures.kept:,} younger rows kept (fill took {figures.fill_seconds:.1f} s)",
        ]
    )


def main() -> None:
    """Run the audit-purge benchmark once and print its figures."""
    figures = asyncio.run(measure())
    if figures.deleted != OLD_ROWS or figures.kept != YOUNG_ROWS:
        raise SystemExit(
            f"audit-purge benchmark: deleted {figures.deleted}, kept {figures.kept}; expected "
            f"{OLD_ROWS} and {YOUNG_ROWS}"
        )
    print(report(figures))


if __name__ == "__main__":
    main()
