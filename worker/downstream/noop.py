"""``USAGE_DOWNSTREAM=noop``: usage is accepted and goes nowhere (a local instance, tests)."""

from __future__ import annotations

from collections.abc import Sequence

from .base import EventData, Outcome


class NoopDownstream:
    """Accepts every batch at once and keeps nothing."""

    name = "noop"

    async def deliver(self, events: Sequence[EventData]) -> Outcome:
        """Accept every event."""
        return Outcome(accepted=frozenset(str(e["id"]) for e in events))

    async def aclose(self) -> None:
        """Nothing to release."""
