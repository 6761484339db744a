"""How long this process has had its database without a break: the gate on judging others dead.

After an outage, every replica's heartbeat is as old as a dead worker's. A replica that comes
back first must not rescue the others' running jobs before they could beat again, so it waits
until it has itself had WORKER_STALE_SECONDS of database since its last failed statement.
"""

from __future__ import annotations

import time

import anyio


class Availability:
    """The instant since which this process's statements have reached the database.

    Components report an unreachable (or read-only) database with :meth:`lost`; the listener
    reports each answer with :meth:`answered`. The clock starts at the first answer after the
    last loss, and at creation: a process that boots knows nothing of the time before it.
    """

    def __init__(self) -> None:
        self._since = time.monotonic()
        self._down = False
        self._back = anyio.Event()

    def lost(self) -> None:
        """A statement found the database unreachable or read-only."""
        self._down = True

    def answered(self) -> None:
        """A statement was answered; after a loss, the clock starts again now."""
        if self._down:
            self._down = False
            self._since = time.monotonic()
            self._back.set()
            self._back = anyio.Event()

    def seconds(self) -> float:
        """How long the database has answered without a break (0 while it does not)."""
        return 0.0 if self._down else time.monotonic() - self._since

    async def wait_back(self) -> None:
        """Return at the next answer that follows a loss."""
        await self._back.wait()
