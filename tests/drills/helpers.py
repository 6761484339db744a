"""What the drills share: the size they run at, waiting on conditions, the ledger, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
from prometheus_client.parser import text_string_to_metric_families

from api_sender import Sender
from tests.support.processes import Daemon, start_daemon
from tests.support.tooljobs import DRILL_LEDGER_DDL

#: ``small`` (the default, CI) or ``full`` (``make drills``): the size each drill runs at.
SCALE = os.environ.get("DRILL_SCALE", "small").strip().lower()
FULL = SCALE == "full"

T = TypeVar("T")

#: Every daemon of a drill runs the drill queue; usage goes nowhere (no hub needed).
DRILL_ENV = {"TOOL_JOBS": "tests.support.tooljobs:DRILL", "USAGE_DOWNSTREAM": "noop"}


def sized(small: T, full: T) -> T:
    """``small`` or ``full``, after DRILL_SCALE."""
    return full if FULL else small


async def fetch(url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    """Run one query on a fresh connection."""
    conn = await asyncpg.connect(url)
    try:
        rows: list[asyncpg.Record] = await conn.fetch(sql, *args)
        return rows
    finally:
        await conn.close()


async def fetchval(url: str, sql: str, *args: Any) -> Any:
    """The first value of one query, on a fresh connection."""
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


async def wait_for(
    check: Callable[[], Awaitable[bool]], timeout: float, what: str, step: float = 0.2
) -> float:
    """Poll ``check`` until it holds; return the seconds it took, or fail naming ``what``."""
    started = time.monotonic()
    while True:
        if await check():
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(step)


async def create_ledger(url: str) -> None:
    """Create public.drill_ledger in the database at ``url``."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(DRILL_LEDGER_DDL)
    finally:
        await conn.close()


@dataclass(frozen=True)
class Runs:
    """What the ledger says about the jobs of one queue."""

    #: job id -> handler runs that finished ('done' rows).
    done: Counter[int]
    #: job id -> handler runs that started.
    started: Counter[int]

    @property
    def duplicates(self) -> dict[int, int]:
        """Jobs whose handler finished more than once, with how often."""
        return {job: n for job, n in self.done.items() if n > 1}

    def missing(self, ids: set[int]) -> set[int]:
        """Jobs of ``ids`` whose handler never finished."""
        return {job for job in ids if self.done[job] == 0}


async def runs(url: str, queue: str) -> Runs:
    """Read the ledger of ``queue``."""
    rows = await fetch(
        url,
        "SELECT job_id, phase, count(*) AS n FROM public.drill_ledger WHERE queue = $1"
        " GROUP BY job_id, phase",
        queue,
    )
    done: Counter[int] = Counter()
    started: Counter[int] = Counter()
    for row in rows:
        if row["phase"] == "done":
            done[row["job_id"]] = row["n"]
        elif row["phase"] == "start":
            started[row["job_id"]] = row["n"]
    return Runs(done, started)


async def states(url: str, queue: str) -> Counter[str]:
    """Jobs of ``queue`` per state."""
    rows = await fetch(
        url,
        "SELECT state::text AS state, count(*) AS n FROM jobs.job WHERE queue = $1 GROUP BY 1",
        queue,
    )
    return Counter({row["state"]: row["n"] for row in rows})


async def completed(url: str, queue: str) -> int:
    """Completed jobs of ``queue``."""
    return (await states(url, queue))["completed"]


async def active_of(url: str, worker_id: str) -> set[int]:
    """Ids of the jobs a worker holds (active, locked by it) right now."""
    rows = await fetch(
        url, "SELECT id FROM jobs.job WHERE state = 'active' AND locked_by = $1::uuid", worker_id
    )
    return {row["id"] for row in rows}


def metric(daemon: Daemon, name: str, **labels: str) -> float:
    """One sample of the daemon's /metrics (0 when absent)."""
    status, text = daemon.get("/metrics", timeout=5.0)
    assert status == 200, f"/metrics answered {status}"
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def log_events(daemon: Daemon, name: str) -> list[dict[str, Any]]:
    """The daemon's JSON log lines with event ``name``."""
    return [e for e in daemon.events() if e.get("event") == name]


def logged_at(event: Mapping[str, Any]) -> float:
    """When a daemon wrote a log line (epoch seconds)."""
    stamp = str(event["timestamp"]).replace("Z", "+00:00")
    return datetime.fromisoformat(stamp).timestamp()


def worker_id(daemon: Daemon) -> str:
    """The per-process owner id a worker logged when it started."""
    for event in log_events(daemon, "worker.started"):
        return str(event["worker_id"])
    raise AssertionError(f"no worker.started in the log of pid {daemon.pid}")


class Fleet:
    """The daemons of one drill: start, kill, restart; everything is SIGKILLed at the end."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.all: list[Daemon] = []
        self._n = 0

    def start(
        self, url: str, env: Mapping[str, str] | None = None, *, role: str = "worker"
    ) -> Daemon:
        """Start one daemon (does not wait for it)."""
        self._n += 1
        daemon = start_daemon(
            url, self.log_dir, role=role, env={**DRILL_ENV, **dict(env or {})}, name=f"d{self._n}"
        )
        self.all.append(daemon)
        return daemon

    async def start_ready(
        self,
        url: str,
        env: Mapping[str, str] | None = None,
        *,
        count: int = 1,
        role: str = "worker",
    ) -> list[Daemon]:
        """Start ``count`` daemons at once and wait until every one is ready."""
        daemons = [self.start(url, env, role=role) for _ in range(count)]
        await asyncio.gather(*(asyncio.to_thread(d.wait_ready, 60) for d in daemons))
        return daemons

    def running(self) -> list[Daemon]:
        """The daemons still alive."""
        return [d for d in self.all if d.process.poll() is None]

    def kill_all(self) -> None:
        """SIGKILL (after SIGCONT, for a paused one) every daemon still running."""
        for daemon in self.all:
            if daemon.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    daemon.signal(signal.SIGCONT)
                daemon.kill()


@dataclass(frozen=True)
class Sample:
    """One answer of a daemon's HTTP listener."""

    at: float
    pid: int
    path: str
    status: int
    seconds: float


class Watch:
    """Polls paths of each daemon from threads (one per daemon) and keeps every answer."""

    def __init__(
        self,
        daemons: list[Daemon],
        paths: tuple[str, ...] = ("/metrics", "/readyz"),
        every: float = 0.25,
        timeout: float = 5.0,
    ) -> None:
        self.samples: list[Sample] = []
        self._daemons = daemons
        self._paths = paths
        self._every = every
        self._timeout = timeout
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._poll, args=(d,), daemon=True) for d in daemons
        ]

    def __enter__(self) -> Watch:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self._timeout + 2)

    def _poll(self, daemon: Daemon) -> None:
        while not self._stop.is_set():
            for path in self._paths:
                began = time.time()
                status, _ = daemon.get(path, timeout=self._timeout)
                self.samples.append(Sample(began, daemon.pid, path, status, time.time() - began))
            self._stop.wait(self._every)

    def of(self, path: str, since: float = 0.0, until: float = float("inf")) -> list[Sample]:
        """The answers on ``path`` begun between ``since`` and ``until`` (epoch seconds)."""
        return [s for s in list(self.samples) if s.path == path and since <= s.at <= until]


class Load:
    """Sends ``batch`` jobs every ``every`` seconds while it runs, riding out database faults
    (a failed send is retried at the next tick); keeps the id and send time of every job."""

    def __init__(
        self, url: str, queue: str, data: Callable[[int], Any], *, batch: int, every: float
    ) -> None:
        self.url = url
        self.queue = queue
        self.data = data
        self.batch = batch
        self.every = every
        #: job id -> when its send returned (epoch seconds).
        self.sent: dict[int, float] = {}
        self.errors = 0
        self.last_error = ""
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def ids(self) -> set[int]:
        """Every job sent so far."""
        return set(self.sent)

    async def __aenter__(self) -> Load:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *_: object) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task

    async def _run(self) -> None:
        n = 0
        sender: Sender | None = None
        try:
            while not self._stop.is_set():
                try:
                    if sender is None:
                        sender = await asyncio.wait_for(
                            Sender.connect(self.url, min_size=1, max_size=1).open(), timeout=5
                        )
                    items = [self.data(n + i) for i in range(self.batch)]
                    ids = await asyncio.wait_for(sender.send_many(self.queue, items), timeout=5)
                    now = time.time()
                    self.sent.update((job_id, now) for job_id in ids)
                    n += self.batch
                except Exception as exc:
                    self.errors += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    if sender is not None:
                        sender.pool.terminate()
                        sender = None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), timeout=self.every)
        finally:
            if sender is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(sender.close(), timeout=5)
