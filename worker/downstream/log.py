"""``USAGE_DOWNSTREAM=log`` (the default): each batch is written to the log, whole."""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from .base import EventData, Outcome

log = structlog.get_logger("worker.downstream")


class LogDownstream:
    """Logs every batch at info level as ``usage.logged`` with its events, then accepts it."""

    name = "log"

    async def deliver(self, events: Sequence[EventData]) -> Outcome:
        """Log the batch and accept every event in it."""
        log.info("usage.logged", count=len(events), events=[dict(e) for e in events])
        return Outcome(accepted=frozenset(str(e["id"]) for e in events))

    async def aclose(self) -> None:
        """Nothing to release."""
