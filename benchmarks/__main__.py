"""``python -m benchmarks``: every queue figure ``RUNS`` (5) times, then the helpers'
benchmarks, then one summary table (see the package docstring for how to read it)."""

from __future__ import annotations

import importlib
import inspect
import os
import platform
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import anyio
import asyncpg

from worker.logging import configure_logging

from . import ceiling, drain, enqueue, graphile_peer, idle, latency, noop, peer, production
from .common import RUNS, admin_url, median, surviving_restarts
from .report import Row, measured, render

MB = 1024 * 1024


LOADS: list[float] = []


def load_average() -> float:
    """The 1-minute load average: how busy the 2 shared cores were (others' tests included)."""
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def progress(message: str) -> None:
    """One line per finished measurement (with the load average), so a long run shows it is
    alive and the reader sees how busy the machine was."""
    load = load_average()
    LOADS.append(load)
    print(f"  {time.strftime('%H:%M:%S')} {message} [load {load:.1f}]", flush=True)


async def server_facts() -> str:
    """The PostgreSQL version and the settings that move these figures."""
    conn = await asyncpg.connect(admin_url())
    try:
        version = await conn.fetchval("SHOW server_version")
        settings = {
            name: await conn.fetchval(f"SHOW {name}")
            for name in ("synchronous_commit", "fsync", "shared_buffers")
        }
    finally:
        await conn.close()
    shown = ", ".join(f"{k}={v}" for k, v in settings.items())
    return f"PostgreSQL {version} on 127.0.0.1:5432 ({shown}); {os.cpu_count()} cores"


async def queue_figures() -> tuple[list[Row], list[str]]:
    """Measure every queue figure ``RUNS`` times; return the rows and the notes."""
    pgq_version = await anyio.to_thread.run_sync(peer.ensure_venv)
    gw_version = await anyio.to_thread.run_sync(graphile_peer.ensure_installed)
    await anyio.to_thread.run_sync(production.ensure_venv)
    facts = await server_facts()
    progress(
        f"{facts}; pgqueuer {pgq_version} in {peer.VENV.relative_to(peer.PEERS.parent)};"
        f" graphile-worker {gw_version} in {graphile_peer.DIR.relative_to(peer.PEERS.parent)}"
    )
    many, chunked, p50s, p99s = [], [], [], []
    peer_chunked, peer50, peer99, floor50, floor99 = [], [], [], [], []
    table50: list[float] = []
    sql50: list[float] = []
    sql99: list[float] = []
    sql_many: list[float] = []
    sync50: list[float] = []
    sync99: list[float] = []
    sync_many: list[float] = []
    ours, theirs, ratios, rss = [], [], [], []
    rss_production: list[float] = []
    peer_rss: list[float] = []
    pick50, pick99, commits, wal = [], [], [], []
    peer_pick50: list[float] = []
    peer_pick99: list[float] = []
    idle_runs: list[idle.IdleResult] = []
    gw_many: list[float] = []
    gw_chunked: list[float] = []
    gw50: list[float] = []
    gw99: list[float] = []
    gw_batched: list[float] = []
    gw_defaults: list[float] = []
    gw_pick50: list[float] = []
    gw_pick99: list[float] = []
    ceilings: list[float] = []
    ceiling_runs: list[ceiling.Ceiling] = []
    wide: list[float] = []
    wide_ceilings: list[float] = []
    real_ceilings: list[float] = []
    #: Per run (a server on this machine): the drain's CPU, the ceiling's CPU per job and rate.
    cpu_runs: list[tuple[drain.DrainCpu, float, float]] = []
    for run in range(RUNS):
        one, chunks = await surviving_restarts(enqueue.send_many_rate)
        many.append(one)
        chunked.append(chunks)
        progress(f"run {run + 1}: send_many {one:,.0f} jobs/s (chunks of 1,000: {chunks:,.0f})")
        p50, p99 = await surviving_restarts(enqueue.single_send_latency)
        p50s.append(p50)
        p99s.append(p99)
        progress(f"run {run + 1}: send p50 {p50:.3f} ms, p99 {p99:.3f} ms")
        s50, s99 = await surviving_restarts(enqueue.sql_send_latency)
        sql50.append(s50)
        sql99.append(s99)
        sql_one, _ = await surviving_restarts(enqueue.sql_send_many_rate)
        sql_many.append(sql_one)
        progress(
            f"run {run + 1}: SELECT jobs.send p50 {s50:.3f} ms, p99 {s99:.3f} ms;"
            f" jobs.send_many {sql_one:,.0f} jobs/s"
        )
        y50, y99 = await surviving_restarts(enqueue.sync_send_latency)
        sync50.append(y50)
        sync99.append(y99)
        sync_many.append(await surviving_restarts(enqueue.sync_send_many_rate))
        progress(
            f"run {run + 1}: SyncSender.send p50 {y50:.3f} ms, p99 {y99:.3f} ms;"
            f" SyncSender.send_many {sync_many[-1]:,.0f} jobs/s"
        )
        theirs_send = await surviving_restarts(lambda: peer.pgqueuer_send(enqueue.SINGLE_SENDS))
        peer_chunked.append(theirs_send.chunked)
        peer50.append(theirs_send.p50_ms)
        peer99.append(theirs_send.p99_ms)
        low50, low99 = await surviving_restarts(enqueue.commit_floor)
        floor50.append(low50)
        floor99.append(low99)
        table50.append((await surviving_restarts(enqueue.job_table_floor))[0])
        progress(
            f"run {run + 1}: pgqueuer enqueue chunks of 1,000 {theirs_send.chunked:,.0f} jobs/s,"
            f" single p50 {theirs_send.p50_ms:.3f} ms, p99 {theirs_send.p99_ms:.3f} ms;"
            f" one-row INSERT p50 {low50:.3f} ms, p99 {low99:.3f} ms;"
            f" INSERT into jobs.job p50 {table50[-1]:.3f} ms"
        )
        gw_send = await surviving_restarts(
            lambda: graphile_peer.graphile_send(
                enqueue.SEND_MANY_JOBS, enqueue.SEND_MANY_CHUNK, enqueue.SINGLE_SENDS
            )
        )
        gw_many.append(gw_send.one_call)
        gw_chunked.append(gw_send.chunked)
        gw50.append(gw_send.p50_ms)
        gw99.append(gw_send.p99_ms)
        progress(
            f"run {run + 1}: graphile-worker addJobs 20,000 in one call {gw_send.one_call:,.0f}"
            f" jobs/s, calls of 1,000 {gw_send.chunked:,.0f} jobs/s;"
            f" addJob p50 {gw_send.p50_ms:.3f} ms, p99 {gw_send.p99_ms:.3f} ms"
        )
        # Rotate which drain goes first, so none always gets the quieter moment.
        drains: dict[str, Any] = {}
        measures: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            ("ours", drain.drain_once),
            ("pgqueuer", peer.pgqueuer_drain),
            ("graphile", lambda: graphile_peer.graphile_drain("batched")),
            ("ceiling", ceiling.ceiling),
            ("production", production.production_drain),
            (
                "wide",
                lambda: drain.drain_once(batch=noop.WIDE_BATCH, concurrency=noop.WIDE_CONCURRENCY),
            ),
            ("wide ceiling", lambda: ceiling.ceiling(batch=noop.WIDE_BATCH)),
            ("cpu", drain.drain_cpu_once),
            ("real ceiling", lambda: ceiling.ceiling(table="real")),
        ]
        shift = run % len(measures)
        for name, measure in measures[shift:] + measures[:shift]:
            drains[name] = await surviving_restarts(measure)
        mine, other, gw, top = (drains[k] for k in ("ours", "pgqueuer", "graphile", "ceiling"))
        ours.append(mine.rate)
        theirs.append(other.rate)
        ratios.append(mine.rate / other.rate)
        rss.append(mine.peak_rss_bytes / MB)
        rss_production.append(drains["production"].peak_rss_bytes / MB)
        peer_rss.append(other.peak_rss_bytes / MB)
        gw_batched.append(gw.rate)
        ceilings.append(top.rate)
        ceiling_runs.append(top)
        wide.append(drains["wide"].rate)
        wide_ceilings.append(drains["wide ceiling"].rate)
        real_ceilings.append(drains["real ceiling"].rate)
        spent: drain.DrainCpu | None = drains["cpu"]
        if spent is not None and top.server_us_per_job is not None:
            cpu_runs.append((spent, top.server_us_per_job, top.rate))
            progress(
                f"run {run + 1}: CPU per job, drain: worker {spent.worker_us_per_job:.1f} µs,"
                f" database {spent.server_us_per_job:.1f} µs; ceiling: database"
                f" {top.server_us_per_job:.1f} µs"
            )
        progress(
            f"run {run + 1}: drain {mine.rate:,.0f} jobs/s, pgqueuer {other.rate:,.0f} jobs/s"
            f" (peak RSS {other.peak_rss_bytes / MB:.1f} MB), "
            f"ratio {mine.rate / other.rate:.2f}, worker peak RSS {mine.peak_rss_bytes / MB:.1f}"
            f" MB (production dependencies: {rss_production[-1]:.1f} MB);"
            f" graphile-worker batched {gw.rate:,.0f} jobs/s (ours / graphile"
            f" {mine.rate / gw.rate:.2f}); SQL-only ceiling {top.rate:,.0f} jobs/s"
            f" ({top.variant} statement(s), {top.clients} client(s); drain / ceiling"
            f" {mine.rate / top.rate:.0%}); at batch {noop.WIDE_BATCH}: drain"
            f" {wide[-1]:,.0f} jobs/s (ours / graphile {wide[-1] / gw.rate:.2f}), ceiling"
            f" {wide_ceilings[-1]:,.0f} jobs/s (drain / ceiling {wide[-1] / wide_ceilings[-1]:.0%})"
        )
        slow = await surviving_restarts(
            lambda: graphile_peer.graphile_drain("defaults", graphile_peer.DEFAULTS_JOBS)
        )
        gw_defaults.append(slow.rate)
        progress(
            f"run {run + 1}: graphile-worker drain of {graphile_peer.DEFAULTS_JOBS:,} with its"
            f" defaults {slow.rate:,.0f} jobs/s"
        )
        p50, p99 = await surviving_restarts(latency.pickup_latency)
        pick50.append(p50)
        pick99.append(p99)
        their50, their99 = await surviving_restarts(
            lambda: peer.pgqueuer_pickup(latency.JOBS, latency.RATE, latency.WARMUP)
        )
        peer_pick50.append(their50)
        peer_pick99.append(their99)
        gw_p50, gw_p99 = await surviving_restarts(
            lambda: graphile_peer.graphile_pickup(latency.JOBS, latency.RATE, latency.WARMUP)
        )
        gw_pick50.append(gw_p50)
        gw_pick99.append(gw_p99)
        progress(
            f"run {run + 1}: pickup p50 {p50:.2f} ms, p99 {p99:.2f} ms;"
            f" pgqueuer p50 {their50:.2f} ms, p99 {their99:.2f} ms;"
            f" graphile-worker p50 {gw_p50:.2f} ms, p99 {gw_p99:.2f} ms"
        )
        result = await surviving_restarts(idle.idle_cost)
        idle_runs.append(result)
        commits.append(float(result.commits))
        wal.append(float(result.worker_wal_bytes))
        progress(
            f"run {run + 1}: idle {result.commits} commits, {result.wal_bytes:,} WAL bytes "
            f"against {result.baseline_wal_bytes:,} with no worker (cluster-wide; other "
            f"databases wrote meanwhile: {result.others_wrote}; rows written in the worker's "
            f"database: {result.own_writes})"
        )
    rows = [
        measured(
            "send_many 20,000 jobs, one call",
            many,
            "jobs/s",
            ">= 60,000 jobs/s",
            lambda v: v >= 60_000,
            peer="pgqueuer 57,000 (chunks of 1,000)",
        ),
        measured(
            "send_many 20,000 jobs, chunks of 1,000",
            chunked,
            "jobs/s",
            ">= 60,000 jobs/s",
            lambda v: v >= 60_000,
            peer="pgqueuer 57,000",
        ),
        _info(
            f"pgqueuer {pgq_version} enqueue, same sitting, chunks of 1,000", peer_chunked, "jobs/s"
        ),
        _ratio_row("send_many chunks ratio ours / pgqueuer", chunked, peer_chunked),
        measured(
            "send p50 (in sequence)",
            p50s,
            "ms",
            "<= 0.35 ms",
            lambda v: v <= 0.35,
            digits=3,
            peer="pgqueuer 0.37",
        ),
        measured(
            "send p99 (in sequence)",
            p99s,
            "ms",
            "<= 1 ms",
            lambda v: v <= 1.0,
            digits=3,
            peer="pgqueuer 0.70",
        ),
        _info(f"pgqueuer {pgq_version} single enqueue p50, same sitting", peer50, "ms", digits=3),
        _info(f"pgqueuer {pgq_version} single enqueue p99, same sitting", peer99, "ms", digits=3),
        _ratio_row("send p50 ratio ours / pgqueuer (lower is better)", p50s, peer50),
        _info(f"graphile-worker {gw_version} addJobs 20,000 in one call", gw_many, "jobs/s"),
        _ratio_row("send_many one call ratio ours / graphile-worker", many, gw_many),
        _info(f"graphile-worker {gw_version} addJobs in calls of 1,000", gw_chunked, "jobs/s"),
        _ratio_row("send_many chunks ratio ours / graphile-worker", chunked, gw_chunked),
        _info(f"graphile-worker {gw_version} single addJob p50", gw50, "ms", digits=3),
        _info(f"graphile-worker {gw_version} single addJob p99", gw99, "ms", digits=3),
        _ratio_row("send p50 ratio ours / graphile-worker (lower is better)", p50s, gw50),
        _ratio_row("send p99 ratio ours / graphile-worker (lower is better)", p99s, gw99),
        _info("floor: one-row INSERT p50 (a bare table, one connection)", floor50, "ms", digits=3),
        _info("floor: one-row INSERT p99", floor99, "ms", digits=3),
        _info(
            "one-row INSERT straight into jobs.job p50 (no function, no NOTIFY)",
            table50,
            "ms",
            digits=3,
        ),
        _ratio_row(
            "INSERT into jobs.job p50 / floor p50 (the job table's own share)", table50, floor50
        ),
        _ratio_row("send p50 / floor p50", p50s, floor50, "<= 1.3x", lambda v: v <= 1.3),
        _info("SELECT jobs.send p50 (SQL function, asyncpg, in sequence)", sql50, "ms", digits=3),
        _info("SELECT jobs.send p99", sql99, "ms", digits=3),
        _ratio_row(
            "SELECT jobs.send p50 / floor p50", sql50, floor50, "<= 1.3x", lambda v: v <= 1.3
        ),
        _info("SyncSender.send p50 (psycopg 3, in sequence)", sync50, "ms", digits=3),
        _info("SyncSender.send p99", sync99, "ms", digits=3),
        _ratio_row(
            "SyncSender.send p50 / floor p50", sync50, floor50, "<= 1.3x", lambda v: v <= 1.3
        ),
        _info("SyncSender.send_many, 20,000 jobs in one call", sync_many, "jobs/s"),
        _ratio_row(
            "jobs.send_many 20,000 in one call / Sender.send_many",
            sql_many,
            many,
            ">= 0.9x",
            lambda v: v >= 0.9,
        ),
        measured(
            f"drain 60,000 no-op jobs, one worker ({drain.SETTINGS})",
            ours,
            "jobs/s",
            "-",
            None,
            peer="pgqueuer 15,000 (batch 50)",
        ),
        _info(f"pgqueuer {pgq_version} drain, same sitting (batch {peer.BATCH})", theirs, "jobs/s"),
        measured(
            "drain ratio ours / pgqueuer",
            ratios,
            "x",
            ">= 1.2x",
            lambda v: v >= 1.2,
            digits=2,
        ),
        _info(
            f"graphile-worker {gw_version} drain, same sitting, batched settings (see notes)",
            gw_batched,
            "jobs/s",
        ),
        _ratio_row(
            "drain ratio ours / graphile-worker batched",
            ours,
            gw_batched,
            ">= 1.2x",
            lambda v: v >= 1.2,
        ),
        _info(
            f"graphile-worker {gw_version} drain of {graphile_peer.DEFAULTS_JOBS:,} with its"
            " defaults",
            gw_defaults,
            "jobs/s",
        ),
        _ratio_row("drain ratio ours / graphile-worker defaults", ours, gw_defaults),
        _info(
            f"SQL-only ceiling: claim + complete, batch {noop.DRAIN_BATCH} (pgbench, bare table)",
            ceilings,
            "jobs/s",
        ),
        measured(
            "drain / SQL-only ceiling",
            [100 * r for r in _ratios(ours, ceilings)],
            "%",
            ">= 85%",
            lambda v: v >= 85,
        ),
        _info(
            f"SQL-only ceiling on the real jobs.job (its indexes and counters), batch"
            f" {noop.DRAIN_BATCH}",
            real_ceilings,
            "jobs/s",
        ),
        _info(
            "drain / ceiling on the real table (what the worker costs; the rest to the bare"
            " ceiling is the schema's)",
            [100 * r for r in _ratios(ours, real_ceilings)],
            "%",
        ),
        *_cpu_rows(cpu_runs),
        _info(
            f"drain at graphile-worker's batch (batch_size={noop.WIDE_BATCH},"
            f" concurrency={noop.WIDE_CONCURRENCY})",
            wide,
            "jobs/s",
        ),
        _ratio_row(
            f"drain ratio ours / graphile-worker batched, both at batch {noop.WIDE_BATCH}",
            wide,
            gw_batched,
            ">= 1.2x",
            lambda v: v >= 1.2,
        ),
        _info(
            f"SQL-only ceiling at batch {noop.WIDE_BATCH} (pgbench, bare table)",
            wide_ceilings,
            "jobs/s",
        ),
        measured(
            f"drain / SQL-only ceiling, both at batch {noop.WIDE_BATCH}",
            [100 * r for r in _ratios(wide, wide_ceilings)],
            "%",
            ">= 85%",
            lambda v: v >= 85,
        ),
        measured(
            "pickup latency p50 at 100 jobs/s",
            pick50,
            "ms",
            "<= 3 ms",
            lambda v: v <= 3.0,
            digits=2,
            peer="pgqueuer 2.9",
        ),
        measured(
            "pickup latency p99 at 100 jobs/s",
            pick99,
            "ms",
            "<= 5 ms",
            lambda v: v <= 5.0,
            digits=2,
            peer="pgqueuer 4.4",
        ),
        _info(f"pgqueuer {pgq_version} pickup p50, same sitting", peer_pick50, "ms", digits=2),
        _info(f"pgqueuer {pgq_version} pickup p99, same sitting", peer_pick99, "ms", digits=2),
        _ratio_row("pickup p50 ratio ours / pgqueuer (lower is better)", pick50, peer_pick50),
        _ratio_row("pickup p99 ratio ours / pgqueuer (lower is better)", pick99, peer_pick99),
        _info(f"graphile-worker {gw_version} pickup p50 (its defaults)", gw_pick50, "ms", 2),
        _info(f"graphile-worker {gw_version} pickup p99 (its defaults)", gw_pick99, "ms", 2),
        _ratio_row("pickup p50 ratio ours / graphile-worker (lower is better)", pick50, gw_pick50),
        _ratio_row("pickup p99 ratio ours / graphile-worker (lower is better)", pick99, gw_pick99),
        measured(
            "idle worker, 7 queues, 30 s: commits",
            commits,
            "",
            "<= 15",
            lambda v: v <= 15,
            peer="pgqueuer 40 (one queue)",
        ),
        _wal_row(wal, idle_runs),
        measured(
            "worker peak RSS (VmHWM after the drain), development venv",
            rss,
            "MB",
            "<= 60 MB",
            lambda v: v <= 60,
            digits=1,
            peer="pgqueuer 47",
        ),
        measured(
            "worker peak RSS after the drain, production dependencies (pip install .)",
            rss_production,
            "MB",
            "<= 50 MB (issue 14)",
            lambda v: v <= 50,
            digits=1,
            peer="pgqueuer 47",
        ),
        _info(
            f"pgqueuer {pgq_version} peak RSS (VmHWM after its drain), same sitting",
            peer_rss,
            "MB",
            1,
        ),
        _ratio_row("peak RSS, production dependencies / pgqueuer", rss_production, peer_rss),
    ]
    notes = [
        facts + f"; Python {platform.python_version()}.",
        f"1-minute load average while measuring: {min(LOADS):.1f} to {max(LOADS):.1f} on "
        f"{os.cpu_count()} cores (above ~2, other work competed for the CPU).",
        f"Each figure: median of {RUNS} runs, each on a fresh scratch database (created, used, "
        "dropped). 2 cores are shared with PostgreSQL and with other developers' test runs: "
        "figures are noisy.",
        f"pgqueuer {pgq_version} from PyPI in benchmarks/.peers/pgqueuer, run through "
        f"pgqueuer.run(factory, batch_size={peer.BATCH}, mode=drain) on uvloop; both drains "
        "timed from the database (first claim/pick to last completion/success).",
        f"graphile-worker {gw_version} from npm in benchmarks/.peers/graphile-worker, driven by"
        " benchmarks/graphile_peer.mjs (one run() process; each figure on its own fresh"
        " database): its drain timed from the first task's first line to an empty job table"
        " (it deletes a job when it completes; polled every 20 ms), batched"
        f" ({graphile_peer.BATCHED}) and with its defaults ({graphile_peer.DEFAULTS};"
        f" {graphile_peer.DEFAULTS_JOBS:,} jobs: one at a time it takes 15 s to 3 min for 60,000"
        " here); addJobs/addJob timed as send_many/send; pickup as ours (its defaults, a"
        " producer process at 100 jobs/s).",
        "SQL-only ceiling: pgbench running our claim and complete statements (built from"
        " worker.queue.sql's pieces) with no worker, on a bare copy of the job table (primary"
        " key and job_fetch only, no trigger), as complete-and-claim in one statement and as"
        " claim then complete, with 1 and 2 clients; the fastest is the ceiling"
        + " (per run: "
        + "; ".join(f"{c.variant} statement(s) x {c.clients}" for c in ceiling_runs)
        + ").",
        "CPU per job (user + system time from /proc, when the server runs on this machine): the"
        " worker process, and every process of the server (the postmaster, its backends and"
        " background writers, with the time of connections that closed meanwhile), over one"
        " more drain of 60,000 whose queue stays paused until the worker is ready (boot"
        " excluded), and over the ceiling's fastest pgbench run. pgbench's own client is not"
        " counted. The ceiling's database has the cores to itself, the drain shares them with the"
        " worker: with every core busy at the drain's CPU per job (worker + server) it would run"
        " at cores / that, the last CPU row as a share of the ceiling.",
        f"The wide drain: graphile-worker's batched settings fetch {noop.WIDE_BATCH} jobs per"
        f" query (localQueue.size); ours at the same batch needs concurrency"
        f" {noop.WIDE_CONCURRENCY} to keep two claims in flight (a poller never holds more jobs"
        " than it can start), and its ceiling is pgbench at that batch too. The peak RSS rows"
        f" are the drain at batch {noop.DRAIN_BATCH}.",
        "The peer column quotes issue 2's medians from 2026-11-29. Measured side by side here:"
        " the drain, pgqueuer's producer (Queries.enqueue on one asyncpg connection, its"
        " driver's model) timed as ours, and its pickup (pgqueuer.run with its defaults, a"
        " producer process at 100 jobs/s, the handler's first line reporting over UDP, as"
        " ours); the floor rows time a one-row INSERT into a bare table,"
        " the cheapest durable commit this server's disk allows, which no send can beat.",
    ]
    return rows, notes


def _info(figure: str, runs: list[float], unit: str, digits: int = 0) -> Row:
    """A figure without a target of its own (a peer's, a ratio, a floor)."""
    return measured(figure, runs, unit, "-", None, digits=digits)


def _cpu_rows(runs: list[tuple[drain.DrainCpu, float, float]]) -> list[Row]:
    """Where a drain's CPU goes, against the ceiling's: no rows when the server is not on this
    machine. The last row is the fastest drain this machine's cores allow at the measured CPU
    per job (every core busy with the worker and the server, nothing waiting), as a share of the
    ceiling: the most a drain could reach of it."""
    if not runs:
        return []
    at = f"batch {noop.DRAIN_BATCH}"
    cores = os.cpu_count() or 1
    worker = [spent.worker_us_per_job for spent, _, _ in runs]
    server = [spent.server_us_per_job for spent, _, _ in runs]
    top = [us for _, us, _ in runs]
    bound = [
        100 * cores * 1e6 / (spent.worker_us_per_job + spent.server_us_per_job) / rate
        for spent, _, rate in runs
    ]
    return [
        _info(f"drain CPU per job, the worker process ({at})", worker, "µs", 1),
        _info(f"drain CPU per job, the database server, all its processes ({at})", server, "µs", 1),
        _info(f"SQL-only ceiling CPU per job, the database server ({at})", top, "µs", 1),
        _info(
            f"drain / ceiling at most, with all {cores} cores busy at the drain's CPU per job",
            bound,
            "%",
        ),
    ]


def _ratios(ours: list[float], theirs: list[float]) -> list[float]:
    """Run by run: ours over theirs (a peer's or the floor's), in the same sitting."""
    return [a / b for a, b in zip(ours, theirs, strict=True)]


def _ratio_row(
    figure: str,
    ours: list[float],
    theirs: list[float],
    target: str = "-",
    check: Callable[[float], bool] | None = None,
) -> Row:
    """A run-by-run ratio row, "ours / theirs" (a peer's or the floor's), to two decimals."""
    return measured(figure, _ratios(ours, theirs), "x", target, check, digits=2)


def _wal_row(wal: list[float], runs: list[idle.IdleResult]) -> Row:
    """WAL is cluster-wide: the figure is the worker's only in runs where nobody else wrote."""
    quiet = [r.worker_wal_bytes for r in runs if not r.others_wrote]
    own_writes = sum(r.own_writes for r in runs)
    if quiet:
        value = median(quiet)
        return Row(
            "idle worker, 30 s: WAL bytes (quiet runs, less the server's own baseline)",
            "0 bytes",
            f"{value:,.0f} bytes",
            value == 0,
            "[" + ", ".join(f"{w:,.0f}" for w in wal) + "]",
            "procrastinate ~1 KB",
        )
    return Row(
        "idle worker, 30 s: WAL bytes (cluster busy)",
        "0 bytes",
        f"n/a; worker's db wrote {own_writes} rows",
        own_writes == 0 if own_writes else None,
        "[" + ", ".join(f"{w:,.0f}" for w in wal) + "]",
        "procrastinate ~1 KB",
    )


def helper_figures() -> tuple[list[Row], list[str]]:
    """Run ``benchmarks.purge``, ``benchmarks.ingest``, ``benchmarks.counts`` and
    ``benchmarks.pooler`` (when present); collect their rows.

    A helper's ``main()`` may be sync or async. If it returns an iterable of :class:`Row` (or of
    ``(figure, target, value, met)`` tuples), those join the summary table.
    """
    rows: list[Row] = []
    notes: list[str] = []
    for name in ("purge", "ingest", "counts", "pooler"):
        try:
            module = importlib.import_module(f"benchmarks.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"benchmarks.{name}":
                continue
            raise
        entry = getattr(module, "main", None)
        if entry is None:
            continue
        print(f"\n== benchmarks.{name} ==", flush=True)
        try:
            result: Any = entry()
            if inspect.isawaitable(result):
                awaitable = result

                async def wait(awaitable: Any = awaitable) -> Any:
                    return await awaitable

                result = anyio.run(wait, backend_options={"use_uvloop": True})
        except Exception as exc:
            notes.append(f"benchmarks.{name} failed: {type(exc).__name__}: {exc}")
            continue
        rows.extend(_as_rows(result))
    return rows, notes


def _as_rows(result: Any) -> Iterable[Row]:
    if not isinstance(result, Iterable) or isinstance(result, str | bytes | dict):
        return []
    out = []
    for item in result:
        if isinstance(item, Row):
            out.append(item)
        elif isinstance(item, tuple) and len(item) == 4:
            figure, target, value, met = item
            out.append(Row(str(figure), str(target), str(value), met))
    return out


def main() -> int:
    """Run everything and print the summary table; exit 0 even when a target is missed."""
    configure_logging("warning", "console")
    print("== queue benchmarks ==", flush=True)
    rows, notes = anyio.run(queue_figures, backend_options={"use_uvloop": True})
    helper_rows, helper_notes = helper_figures()
    print("\n== summary ==")
    print(render([*rows, *helper_rows], [*notes, *helper_notes]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
