"""What every usage downstream answers: which events it took, which it holds, or an error."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

#: One event as the usage queue carries it (``UsageEvent.to_job_data()``).
EventData = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class HeldEvent:
    """An event the downstream refused for now (its date is outside the hub's window)."""

    id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Outcome:
    """A downstream's answer to one batch: every event not held counts as delivered."""

    accepted: frozenset[str] = frozenset()
    duplicate: frozenset[str] = frozenset()
    held: tuple[HeldEvent, ...] = field(default_factory=tuple)

    @property
    def held_ids(self) -> frozenset[str]:
        """The ids of the held events."""
        return frozenset(h.id for h in self.held)


class DownstreamError(Exception):
    """The batch was not delivered: the whole batch goes back to its retry."""


class ContentRefused(DownstreamError):
    """The downstream refused the batch for its content (400, 413, 422).

    Unlike an outage or bad credentials, one event can cause this, so the usage worker splits a
    refused batch to isolate that event instead of letting it block every event it meets.
    """


class Downstream(Protocol):
    """Where usage batches go: ``noop``, ``log`` or ``http`` (the hub poster)."""

    #: The name USAGE_DOWNSTREAM selects it by.
    name: str

    async def deliver(self, events: Sequence[EventData]) -> Outcome:
        """Deliver the batch whole; raise :class:`DownstreamError` if it was not delivered."""
        ...

    async def aclose(self) -> None:
        """Release connections (the process is stopping)."""
        ...
