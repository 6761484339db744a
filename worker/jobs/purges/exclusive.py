"""One run of a purge at a time, across every replica and every queue schema of a database.

A singleton queue keeps one job *per key* active, and a cron slot, a hand-sent job and a
catch-up each carry their own key; a rescued job can run again while its stalled first run goes
on. So the run itself holds a session advisory lock, named after the purge and the ``public``
tables it sweeps (not the queue schema: every schema's purges act on the same tables), for as
long as it works. The lock lives on a dedicated connection to the server, never a pooled one:
the pool skips asyncpg's reset on release, and a transaction pooler would hand the session to
someone else. If that connection dies, the lock is gone, so the run is cancelled and fails
rather than go on unguarded (the job retries).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import asyncpg
import structlog

from ...db.connections import connect
from ...db.locks import session_lock

log = structlog.get_logger("worker.purge")

#: How long a run waits for another run of its purge before its job fails (and retries): above
#: one run's time budget and statement caps, well below the purge job's expiry.
RUN_LOCK_WAIT_SECONDS = 900.0
#: Slices of that wait (each one statement, so no snapshot is held for long), and how often the
#: waiting run logs who it waits for.
RUN_LOCK_POLL_SECONDS = 10.0
#: The schema of the tables every purge acts on (contract section 8).
CHASSIS_SCHEMA = "public"


class RunLockLost(Exception):
    """The connection holding the run lock died mid-run, so the run stopped."""


@asynccontextmanager
async def exclusive_run(
    url: str, queue: str, *, wait: float = RUN_LOCK_WAIT_SECONDS
) -> AsyncIterator[None]:
    """Hold ``queue``'s purge lock for the block, waiting at most ``wait`` seconds for it
    (``LockTimeout`` after that); cancel the block and raise :class:`RunLockLost` if the lock's
    connection dies before the block ends."""
    conn = await connect(
        url, server_settings={"application_name": f"chassis-worker purge lock {queue}"}
    )
    try:
        async with session_lock(
            conn, f"purge:{queue}", CHASSIS_SCHEMA, timeout=wait, poll=RUN_LOCK_POLL_SECONDS
        ):
            with anyio.CancelScope() as guarded:

                def lost(_: asyncpg.Connection) -> None:
                    guarded.cancel()

                conn.add_termination_listener(lost)
                try:
                    yield
                finally:
                    conn.remove_termination_listener(lost)
            if guarded.cancel_called:
                log.error("purge.lock_lost", queue=queue)
                raise RunLockLost(f"the run lock of {queue} was lost with its connection")
    finally:
        with anyio.CancelScope(shield=True):
            await conn.close(timeout=5)
