"""The SQL-only ceiling of the drain: pgbench running the claim and complete statements alone,
with no worker process, at the drain's batch size.

As the floor row does for sends, this tells what the database on this machine allows today:
no worker can drain faster than its own statements run back to back. The statements are built
from the same pieces as ``worker.queue.sql`` (``_claim_next``, ``_claim_update``,
``_complete_update``), with pgbench variables in place of the parameters, so they change when
ours do:

* ``one statement``: what the drain sends in steady state, the successes of the previous batch
  completed and the next batch claimed in one statement and one commit, as
  ``COMPLETE_AND_CLAIM``;
* ``two statements``: the claim alone, then the completion of that batch (``COMPLETE_LOST``),
  two commits per batch.

Every commit is made as the worker makes it: without waiting for the disk (claims always, and
completions as the worker writes them, kept until flushed: worker.queue.unflushed).

Each runs on a fresh scratch database, on a **bare** table (``LIKE jobs.job``: its columns,
defaults and identity, the primary key and the ``job_fetch`` index the claim reads, no other
index and no trigger), and again on the real ``jobs.job`` of an installed schema (its indexes
and its finished-job counters), so the gap between the two is the schema's own cost and the
gap between the real one and the drain is the worker's. pgbench carries each claim's ids,
attempts and claim instants to the completion in variables (``\\gset``), so the claim returns
its columns aggregated into arrays in one row instead of one row per job: the database does the
same work, the client parses one row. Clients: 1 (the drain's one fetcher sends its
statements one after another) and 2 (the machine's cores).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import anyio
import asyncpg

from worker.queue.sql import _JOB_COLUMNS, _claim_next, _claim_update, _complete_update

from . import cpu
from .common import install_queues, scratch_database
from .drain import fill
from .noop import DRAIN, DRAIN_BATCH, DRAIN_QUEUE

JOBS = 60_000
PGBENCH_CANDIDATES = ("/usr/lib/postgresql/15/bin/pgbench",)

#: pgbench variables in place of the statements' parameters.
#: The arrays in id order, as the worker sends them (store.Fence: the completion's fence finds
#: each row's entries by binary search).
_AGGREGATED = (
    "SELECT array_agg(id ORDER BY id) AS ids, array_agg(attempt ORDER BY id) AS attempts,"
    " array_agg(claim ORDER BY id) AS claims, array_agg(data) AS payloads FROM claimed"
)


def one_statement_script(schema: str) -> str:
    """Complete the previous batch and claim the next, in one statement (COMPLETE_AND_CLAIM)."""
    body = (
        "WITH done AS (\n"
        + _complete_update(":ids", ":attempts", ":claims", ":owner", lazy_if=True)
        + "\n), next AS (\n"
        + _claim_next(":queue", ":batch")
        + "\n), claimed AS (\n"
        + _claim_update("next", ":owner")
        + "\n), lost AS (\n"
        "SELECT ARRAY(SELECT unnest(:ids::bigint[]) EXCEPT ALL SELECT id FROM done) AS lost\n"
        ")\n" + _AGGREGATED.replace(" FROM claimed", ", (SELECT lost FROM lost) FROM claimed")
    )
    return _pgbench(body.format(s=schema, cols=_JOB_COLUMNS)) + "\\gset\n"


def two_statement_script(schema: str) -> str:
    """The claim alone (lazy commit, as CLAIM), then the completion of its batch (COMPLETE_LOST)."""
    claim = (
        "WITH next AS (\n"
        + _claim_next(":queue", ":batch")
        + "\n), claimed AS (\n"
        + _claim_update("next", ":owner", lazy_commit=True)
        + "\n)\n"
        + _AGGREGATED
    )
    complete = (
        "WITH done AS (\n"
        + _complete_update(":ids", ":attempts", ":claims", ":owner", lazy_if=True)
        + "\n)\nSELECT ARRAY(SELECT unnest(:ids::bigint[]) EXCEPT ALL SELECT id FROM done)"
        " AS lost"
    )
    return (
        _pgbench(claim.format(s=schema, cols=_JOB_COLUMNS))
        + "\\gset\n"
        + _pgbench(complete.format(s=schema, cols=_JOB_COLUMNS))
        + "\n"
    )


def _pgbench(statement: str) -> str:
    """One statement on one line (pgbench ends a command at the end of its line), comments
    dropped; ``:owner`` is a uuid and ``:queue`` text, typed for the prepared statement; the
    completion commits lazily, as the worker's does (``:lazy`` true)."""
    lines = [re.sub(r"--.*$", "", line).strip() for line in statement.splitlines()]
    text = " ".join(line for line in lines if line)
    text = text.replace(":lazy::bool", "true")
    return text.replace(":owner", ":owner::uuid").replace(":queue", ":queue::text") + ";\n"


@dataclass(frozen=True, slots=True)
class Ceiling:
    """One pgbench run: completed jobs per second over its transactions."""

    variant: str
    table: str
    clients: int
    rate: float
    #: The server's CPU time per completed job over the pgbench run (None: not on this machine).
    server_us_per_job: float | None = None


def pgbench_path() -> str:
    """PostgreSQL's pgbench (Debian keeps it off PATH)."""
    found = shutil.which("pgbench")
    if found:
        return found
    for candidate in PGBENCH_CANDIDATES:
        if Path(candidate).exists():
            return candidate
    raise RuntimeError("pgbench not found: apt-get install postgresql-client-15")


async def _bare_table(url: str) -> None:
    """``bare.job``: the columns of ``jobs.job`` with only the primary key and job_fetch."""
    conn = await asyncpg.connect(url)
    try:
        fetch_index = await conn.fetchval(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = 'jobs' AND indexname = 'job_fetch'"
        )
        await conn.execute(
            """
            CREATE SCHEMA bare;
            CREATE TABLE bare.job
                (LIKE jobs.job INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING GENERATED);
            ALTER TABLE bare.job ADD PRIMARY KEY (id);
            CREATE TABLE bare.queue (name text PRIMARY KEY, paused boolean NOT NULL DEFAULT false);
            """
        )
        await conn.execute(fetch_index.replace(" ON jobs.job ", " ON bare.job "))
        await conn.execute("INSERT INTO bare.queue (name) VALUES ($1)", DRAIN_QUEUE)
    finally:
        await conn.close()


async def _fill(url: str, schema: str, jobs: int) -> None:
    """``jobs`` jobs sent as the drain's are (``send_many``); the bare table gets copies."""
    await fill(url, jobs)
    conn = await asyncpg.connect(url)
    try:
        if schema == "bare":
            await conn.execute(
                "INSERT INTO bare.job OVERRIDING SYSTEM VALUE SELECT * FROM jobs.job"
            )
        await conn.execute(f"VACUUM ANALYZE {schema}.job")
    finally:
        await conn.close()


def _run_pgbench(url: str, script: str, clients: int, transactions: int, batch: int) -> float:
    """Run ``script`` ``transactions`` times per client; return pgbench's tps (without
    connection time)."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", prefix="ceiling-", delete=False) as f:
        f.write(script)
        path = f.name
    try:
        done = subprocess.run(
            [
                pgbench_path(),
                "-n",
                "-M",
                "prepared",
                "-f",
                path,
                "-c",
                str(clients),
                "-j",
                str(clients),
                "-t",
                str(transactions),
                "-D",
                f"owner={uuid.uuid4()}",
                "-D",
                f"queue={DRAIN_QUEUE}",
                "-D",
                f"batch={batch}",
                "-D",
                "ids={}",
                "-D",
                "attempts={}",
                "-D",
                "claims={}",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        Path(path).unlink()
    match = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", done.stdout)
    failed = re.search(r"number of failed transactions: ([0-9]+)", done.stdout)
    if done.returncode != 0 or match is None or (failed is not None and failed.group(1) != "0"):
        raise RuntimeError(f"pgbench failed:\n{done.stdout}\n{done.stderr}")
    return float(match.group(1))


async def ceiling_once(
    variant: str, table: str, clients: int, jobs: int = JOBS, batch: int = DRAIN_BATCH
) -> Ceiling:
    """One pgbench run of ``variant`` (``one`` or ``two`` statements) on a fresh database's
    ``bare`` or ``real`` table with ``clients`` clients, completing about ``jobs`` jobs in
    batches of ``batch``."""
    schema = "bare" if table == "bare" else "jobs"
    script = one_statement_script(schema) if variant == "one" else two_statement_script(schema)
    transactions = max(1, jobs // batch // clients)
    async with scratch_database("ceiling") as url:
        await install_queues(url, DRAIN)
        if table == "bare":
            await _bare_table(url)
        # Spare rows, so even the last transaction of every client claims a full batch.
        await _fill(url, schema, transactions * clients * batch + clients * batch)
        postmaster = await cpu.postmaster_of(url)
        before = 0.0 if postmaster is None else cpu.server_seconds(postmaster)
        tps = await anyio.to_thread.run_sync(
            lambda: _run_pgbench(url, script, clients, transactions, batch)
        )
        used = None
        if postmaster is not None:
            await cpu.quiesced(url)
            used = cpu.server_seconds(postmaster) - before
        # The fence must have matched: every batch claimed was completed (but a client's last
        # claim under one statement, which the next transaction would have completed).
        conn = await asyncpg.connect(url)
        try:
            done = await conn.fetchval(
                f"SELECT count(*) FROM {schema}.job WHERE state = 'completed'"
            )
        finally:
            await conn.close()
    wanted = (transactions - (1 if variant == "one" else 0)) * clients * batch
    if done != wanted:
        raise RuntimeError(f"ceiling {variant}/{table}/{clients}: {done} of {wanted} completed")
    # One statement: each transaction completes the previous batch (a client's first completes
    # none); two statements: each completes its own.
    completing = (transactions - 1) / transactions if variant == "one" else 1.0
    per_job = None if used is None or not done else 1e6 * used / done
    return Ceiling(variant, table, clients, tps * batch * completing, per_job)


async def ceiling(table: str = "bare", batch: int = DRAIN_BATCH) -> Ceiling:
    """The fastest of both variants with 1 and 2 clients on ``table`` at ``batch``: the
    ceiling."""
    runs = [
        await ceiling_once(variant, table, clients, batch=batch)
        for variant in ("one", "two")
        for clients in (1, 2)
    ]
    return max(runs, key=lambda c: c.rate)
