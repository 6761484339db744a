"""A level-triggered wake-up that cannot be lost between "checked for work" and "went to sleep"."""

from __future__ import annotations

import anyio


class Waker:
    """Wakes sleepers; a sleeper that read ``generation`` before looking for work wakes at once
    if a wake happened since, so a notification arriving mid-claim is never missed."""

    def __init__(self) -> None:
        self.generation = 0
        self._event = anyio.Event()

    def wake(self) -> None:
        """Wake every current sleeper and every later ``wait_since`` of an older generation."""
        self.generation += 1
        self._event.set()
        self._event = anyio.Event()

    async def wait_since(self, generation: int, timeout: float | None = None) -> None:
        """Sleep until a wake newer than ``generation`` (or ``timeout`` seconds)."""
        if self.generation != generation:
            return
        event = self._event
        with anyio.move_on_after(timeout):
            await event.wait()
