"""How a held-queue job says why it is held, and how logs name an event."""

from __future__ import annotations

from typing import Any

from api_sender.usage import event_id_of

#: The singleton key of a window hold on the held queue. The held queue's policy is standard, so
#: the key enforces nothing; it is the label that tells a window hold (sent by the usage worker)
#: from a retry-budget hold (the dead-letter copy, which carries no key).
WINDOW_HOLD_PREFIX = "occurred_at_window:"

#: The reasons of ``usage_events_held_total``.
RETRY_BUDGET = "retry_budget"
OCCURRED_AT_WINDOW = "occurred_at_window"


def window_hold_key(event_id: str) -> str:
    """The held-queue key of a window hold of ``event_id``."""
    return WINDOW_HOLD_PREFIX + event_id


def hold_reason(singleton_key: str | None) -> str:
    """Why a held-queue job is held, from its key."""
    if singleton_key is not None and singleton_key.startswith(WINDOW_HOLD_PREFIX):
        return OCCURRED_AT_WINDOW
    return RETRY_BUDGET


def shown_id(data: Any, job_id: int) -> str:
    """The event id for logs and operator tools; ``job:<id>`` for data without one."""
    return event_id_of(data) or f"job:{job_id}"
