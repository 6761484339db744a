"""How many jobs this process holds (claimed, outcome not yet written): drives the heartbeat."""

from __future__ import annotations

import anyio


class Holdings:
    """A counter with an event for "holds at least one job"."""

    def __init__(self) -> None:
        self.count = 0
        self._nonzero = anyio.Event()
        self._zero = anyio.Event()
        self._zero.set()

    def add(self, n: int) -> None:
        """Count ``n`` newly claimed jobs."""
        if n <= 0:
            return
        self.count += n
        if not self._nonzero.is_set():
            self._nonzero.set()
            self._zero = anyio.Event()

    def remove(self, n: int) -> None:
        """Count ``n`` jobs whose outcome is written (or given up)."""
        if n <= 0:
            return
        self.count = max(0, self.count - n)
        if self.count == 0:
            self._zero.set()
            self._nonzero = anyio.Event()

    async def wait_nonzero(self) -> None:
        """Return once at least one job is held."""
        await self._nonzero.wait()

    async def wait_zero(self) -> None:
        """Return once no job is held."""
        await self._zero.wait()
