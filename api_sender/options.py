"""Validation of what a caller passes to ``send``: payload encoding and per-send options."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .errors import InvalidJob

#: A delay in seconds from the database's now(), or an absolute, timezone-aware instant.
StartAfter = float | int | datetime | None


def encode_data(data: Any) -> str:
    """Encode a job payload as JSON text, refusing values JSON cannot carry (NaN, sets, ...)."""
    try:
        return json.dumps(data, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidJob(f"job data is not JSON-serialisable: {exc}") from None


@dataclass(frozen=True, slots=True)
class SendOptions:
    """Per-send options; ``None`` means "the queue's setting"."""

    start_after: StartAfter = None
    singleton_key: str | None = None
    priority: int = 0
    retry_limit: int | None = None
    retry_delay: int | None = None
    retry_backoff: bool | None = None
    expire_in_seconds: int | None = None

    def __post_init__(self) -> None:
        _check_start_after(self.start_after)
        if self.singleton_key is not None and (
            not isinstance(self.singleton_key, str) or not self.singleton_key
        ):
            raise InvalidJob("singleton_key must be a non-empty string or None")
        _check_int("priority", self.priority, minimum=-(2**31), allow_none=False)
        _check_int("retry_limit", self.retry_limit, minimum=0)
        _check_int("retry_delay", self.retry_delay, minimum=0)
        _check_int("expire_in_seconds", self.expire_in_seconds, minimum=1)
        if self.retry_backoff is not None and not isinstance(self.retry_backoff, bool):
            raise InvalidJob("retry_backoff must be a bool or None")

    def args(self) -> tuple[Any, ...]:
        """The statement parameters $3..$10 shared by send and send_many, in order."""
        delay, at = split_start_after(self.start_after)
        return (
            self.priority,
            self.singleton_key,
            delay,
            at,
            self.retry_limit,
            self.retry_delay,
            self.retry_backoff,
            self.expire_in_seconds,
        )


def split_start_after(value: StartAfter) -> tuple[float | None, datetime | None]:
    """Split ``start_after`` into (seconds from now, absolute instant) statement parameters."""
    _check_start_after(value)
    if isinstance(value, datetime):
        return None, value
    if value is None:
        return None, None
    return float(value), None


def _check_start_after(value: StartAfter) -> None:
    if value is None:
        return
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidJob("start_after must be timezone-aware when given as a datetime")
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidJob("start_after must be seconds (a number), a datetime or None")
    if not math.isfinite(value) or value < 0:
        raise InvalidJob("start_after must be a finite, non-negative number of seconds")


def _check_int(name: str, value: int | None, *, minimum: int, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJob(f"{name} must be an integer")
    if not minimum <= value < 2**31:
        raise InvalidJob(f"{name} must be between {minimum} and {2**31 - 1}")
