"""Tool job declarations the daemon under test loads through TOOL_JOBS.

Every run is written to ``public.ledger`` so a test can count executions (loss, duplicates).
The job's data steers the handler: ``{"sleep": s}`` runs s seconds, ``{"fail": true}`` raises,
``{"exit": true}`` kills the process mid-job (a poison job).
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
import uuid
from datetime import datetime
from typing import Any, Literal

import asyncpg
from pydantic import BaseModel, ConfigDict

from worker import JobDeclaration, JobInfo, QueueOptions, Schedule

LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS public.ledger (
    seq     bigint GENERATED ALWAYS AS IDENTITY,
    job_id  bigint NOT NULL,
    queue   text NOT NULL,
    key     text,
    data    jsonb,
    attempt integer NOT NULL,
    pid     integer NOT NULL,
    phase   text NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)"""


class _LazyPool:
    """A pool opened on first use, once: handlers starting together would otherwise each open
    one of their own."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._pool: asyncpg.Pool | None = None
        self._lock: asyncio.Lock | None = None

    async def get(self) -> asyncpg.Pool:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._pool is None:
                # Behind a transaction pooler the daemon runs with a statement cache of 0
                # (contract section 12); its handlers' pools must too.
                cache = int(os.environ.get("DATABASE_STATEMENT_CACHE_SIZE", "100"))
                self._pool = await asyncpg.create_pool(
                    os.environ["DATABASE_URL"], statement_cache_size=cache, **self._options
                )
        assert self._pool is not None
        return self._pool


#: The ledger only counts runs; no test restarts the server under it (the drills have their own),
#: so its writes need not wait for the disk: the worker's are what is tested.
_ledger = _LazyPool(min_size=1, max_size=4, server_settings={"synchronous_commit": "off"})


async def _write(phase: str, data: Any, job: JobInfo) -> None:
    pool = await _ledger.get()
    await pool.execute(
        "INSERT INTO public.ledger (job_id, queue, key, data, attempt, pid, phase)"
        " VALUES ($1, $2, $3, $4::text::jsonb, $5, $6, $7)",
        job.id,
        job.queue,
        job.key,
        None if data is None else __import__("json").dumps(data),
        job.attempt,
        os.getpid(),
        phase,
    )


async def record(data: Any, job: JobInfo) -> None:
    """Write 'start', obey the data's instructions, write 'done'."""
    await _write("start", data, job)
    if isinstance(data, dict):
        if data.get("exit"):
            os._exit(3)
        if data.get("sleep"):
            await asyncio.sleep(float(data["sleep"]))
        if data.get("fail"):
            raise RuntimeError("asked to fail")
    await _write("done", data, job)


#: A work queue: batches of 10, 4 handlers at once.
WORK = [JobDeclaration(queue="tool-work", handler=record, batch_size=10, concurrency=4)]

#: The same queue, wider: for volume tests, where the ledger's commits set the pace.
WORK_WIDE = [JobDeclaration(queue="tool-work", handler=record, batch_size=50, concurrency=16)]

#: A cron queue; the cron comes from TEST_TOOL_CRON (6 fields: seconds first).
CRON = [
    JobDeclaration(
        queue="tool-cron",
        handler=record,
        schedule=Schedule(
            cron=os.environ.get("TEST_TOOL_CRON", "*/2 * * * * *"),
            enabled=os.environ.get("TEST_TOOL_CRON_ENABLED", "1") == "1",
        ),
    )
]

#: A timer queue (no schedule).
TIMERS = [JobDeclaration(queue="tool-timer", handler=record)]


class Invoice(BaseModel):
    """The typed queue's payload: a number, an instant and a choice (each validated)."""

    model_config = ConfigDict(extra="forbid")

    number: int
    issued_at: datetime
    currency: Literal["EUR", "USD"]


async def record_typed(data: Any, job: JobInfo) -> None:
    """Write 'got <the type of data>' with its JSON dump, then 'done'."""
    dump = data.model_dump(mode="json") if isinstance(data, BaseModel) else data
    await _write(f"got {type(data).__name__}", dump, job)
    await _write("done", dump, job)


#: A typed queue (payload Invoice, five retries) and its dead letter, declared first.
TYPED = [
    JobDeclaration(queue="tool-typed-dead", handler=record),
    JobDeclaration(
        queue="tool-typed",
        handler=record_typed,
        payload=Invoice,
        options=QueueOptions(retry_limit=5, dead_letter="tool-typed-dead"),
    ),
]


# --- The fault drills (tests/drills) -------------------------------------------------------------
#
# A ledger whose writes survive the faults the drills inject: each handler run has its own id, a
# write that meets a dropped, read-only or restarting database is retried, and a retried write
# that had in fact committed is absorbed by the (run, phase) key. So the ledger counts handler
# runs exactly, and a job never fails because the test's own bookkeeping could not be written.

DRILL_LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS public.drill_ledger (
    run     uuid NOT NULL,
    phase   text NOT NULL,
    job_id  bigint NOT NULL,
    queue   text NOT NULL,
    key     text,
    attempt integer NOT NULL,
    pid     integer NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (run, phase)
)"""

#: How long a drill handler keeps retrying one ledger write before it gives up (and fails).
DRILL_WRITE_PATIENCE = float(os.environ.get("DRILL_WRITE_PATIENCE", "90"))

_DRILL_RETRYABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.AdminShutdownError,
    asyncpg.ReadOnlySQLTransactionError,
    asyncpg.InternalClientError,
)

_drill_ledger = _LazyPool(
    min_size=0,
    max_size=int(os.environ.get("DRILL_LEDGER_POOL", "2")),
    # The ledger must be writable even while a drill makes new sessions read-only.
    server_settings={"application_name": "drill ledger", "default_transaction_read_only": "off"},
)


async def _drill_write(run: uuid.UUID, phase: str, job: JobInfo) -> None:
    deadline = time.monotonic() + DRILL_WRITE_PATIENCE
    while True:
        try:
            pool = await _drill_ledger.get()
            await asyncio.wait_for(
                pool.execute(
                    "INSERT INTO public.drill_ledger (run, phase, job_id, queue, key, attempt, pid)"
                    " VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
                    run,
                    phase,
                    job.id,
                    job.queue,
                    job.key,
                    job.attempt,
                    os.getpid(),
                ),
                timeout=10,
            )
            return
        except _DRILL_RETRYABLE:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


_handler_pool: Any = None


def _daemon_pool() -> Any:
    """The daemon's own handler pool (``JobContext.pool``).

    Tool handlers are not handed the context, so the starvation drill finds the one
    ``JobContext`` of this process on the heap: the connections it borrows are the daemon's.
    """
    global _handler_pool
    if _handler_pool is None:
        from worker.jobs.spec import JobContext

        contexts = [o for o in gc.get_objects() if isinstance(o, JobContext)]
        if not contexts:
            raise RuntimeError("no JobContext in this process")
        _handler_pool = contexts[0].pool
    return _handler_pool


async def drill(data: Any, job: JobInfo) -> None:
    """A drill job: ledger 'start', obey the data, ledger 'done'.

    ``sleep`` s (only on the first attempt with ``sleep_once``), ``borrow`` s holding one of the
    daemon's pool connections, ``exit`` kills the process mid-job, ``fail`` raises.
    """
    run = uuid.uuid4()
    await _drill_write(run, "start", job)
    if isinstance(data, dict):
        if data.get("exit"):
            os._exit(3)
        sleep = float(data.get("sleep") or 0)
        if sleep and (job.attempt == 1 or not data.get("sleep_once")):
            await asyncio.sleep(sleep)
        if data.get("borrow"):
            async with _daemon_pool().acquire() as conn:
                await conn.execute("SELECT pg_sleep($1)", float(data["borrow"]))
        if data.get("fail"):
            raise RuntimeError("asked to fail")
    await _drill_write(run, "done", job)


async def drill_dead_letter(data: Any, job: JobInfo) -> None:
    """A dead-letter consumer: records the copy, never obeys it."""
    run = uuid.uuid4()
    await _drill_write(run, "dead", job)


#: The drills' work queue: batches of 8, 8 handlers at once, a retry budget no fault exhausts.
DRILL = [
    JobDeclaration(
        queue="drill-work",
        handler=drill,
        batch_size=8,
        concurrency=8,
        options=QueueOptions(retry_limit=10),
    )
]

#: Wide consumers for the concurrent-claim drill: 16 handlers, batches of 16.
DRILL_WIDE = [
    JobDeclaration(
        queue="drill-claim",
        handler=drill,
        batch_size=16,
        concurrency=16,
        options=QueueOptions(retry_limit=10),
    )
]

#: A per-second cron.
DRILL_CRON = [
    JobDeclaration(
        queue="drill-cron",
        handler=drill,
        schedule=Schedule(cron="* * * * * *"),
        options=QueueOptions(retry_limit=10),
    )
]

#: A queue for poison jobs (two retries) and its dead letter, declared first.
DRILL_POISON = [
    JobDeclaration(queue="drill-poison-dead", handler=drill_dead_letter),
    JobDeclaration(
        queue="drill-poison",
        handler=drill,
        batch_size=4,
        concurrency=4,
        options=QueueOptions(retry_limit=2, dead_letter="drill-poison-dead"),
    ),
]

#: Many handlers over a small pool: 32 at once, each may borrow one of the daemon's connections.
DRILL_STARVE = [
    JobDeclaration(
        queue="drill-starve",
        handler=drill,
        batch_size=32,
        concurrency=32,
        options=QueueOptions(retry_limit=10),
    )
]

#: The bloat soak: retention from DRILL_RETENTION_SECONDS (completed jobs are pruned after it).
DRILL_SOAK = [
    JobDeclaration(
        queue="drill-soak",
        handler=drill,
        batch_size=16,
        concurrency=8,
        options=QueueOptions(
            retry_limit=10,
            retention_seconds=int(os.environ.get("DRILL_RETENTION_SECONDS", "3600")),
        ),
    )
]


# --- Declarations the install must refuse, or must re-apply (tests/daemon/test_declarations.py) --

#: A tool queue named TEST_TOOL_QUEUE (a chassis queue's name: refused at boot).
REDECLARE = [
    JobDeclaration(queue=os.environ.get("TEST_TOOL_QUEUE", "usage-events"), handler=record)
]

#: A dead letter of policy TEST_TOOL_DEAD_POLICY (short and stately are refused at boot).
DEAD_LETTER_POLICY = [
    JobDeclaration(
        queue="tool-dead",
        handler=record,
        options=QueueOptions(policy=os.environ.get("TEST_TOOL_DEAD_POLICY", "short")),
    ),
    JobDeclaration(queue="tool-src", handler=record, options=QueueOptions(dead_letter="tool-dead")),
]

#: A queue whose dead letter is itself.
SELF_DEAD_LETTER = [
    JobDeclaration(queue="tool-self", handler=record, options=QueueOptions(dead_letter="tool-self"))
]

#: A queue whose dead letter this deployment does not declare (another one installed it).
DEAD_LETTER_ELSEWHERE = [
    JobDeclaration(
        queue="tool-src", handler=record, options=QueueOptions(dead_letter="tool-elsewhere")
    )
]

#: The work queue with the policy TEST_TOOL_POLICY: a redeploy changes it.
POLICY = [
    JobDeclaration(
        queue="tool-policy",
        handler=record,
        batch_size=10,
        concurrency=4,
        options=QueueOptions(policy=os.environ.get("TEST_TOOL_POLICY", "standard")),
    )
]
