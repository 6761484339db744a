"""Validation of what a caller passes to ``send``: payload encoding and per-send options.

Everything PostgreSQL would refuse is refused here first, as :class:`InvalidJob` naming the
field: a NUL or lone surrogate in data, keys or queue names, a non-finite number, a delay past
:data:`MAX_START_AFTER_SECONDS`, an instant outside years 1-9999 in UTC.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

from pydantic import BaseModel

from .errors import InvalidJob
from .storable import find_unstorable, instant_problem, json_text_is_storable, text_problem

#: A delay in seconds from the database's now(), or an absolute, timezone-aware instant.
StartAfter = float | int | datetime | None

#: The longest delay a send or timer takes: 100 years of 365.25 days (3,155,760,000 s). Far
#: inside PostgreSQL's interval and timestamptz ranges; anything longer is a unit mistake.
MAX_START_AFTER_SECONDS = 3_155_760_000


def _model_dump(value: Any) -> Any:
    """A pydantic model (anywhere in a payload) is sent as ``model_dump(mode="json")``."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


#: One encoder for every payload: ``send_many`` encodes thousands. Non-ASCII text is kept as is
#: (not escaped), so a lone surrogate stays visible to the one check on the encoded text. Only
#: what JSON has no form for reaches ``default``, so plain payloads pay nothing for models.
_ENCODER = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_model_dump
)


def encode_data(data: Any, field: str = "data") -> str:
    """Encode a job payload as JSON text; :class:`InvalidJob` naming the path (``data.a.0``)
    for anything jsonb cannot hold: NaN, infinities, sets, NUL, lone surrogates, deep nesting.
    A pydantic model, the payload or a part of it, is encoded as its
    ``model_dump(mode="json")`` and checked as that."""
    try:
        text = _ENCODER.encode(data)
    except (TypeError, ValueError, RecursionError) as exc:
        raise _unencodable(data, field, exc) from None
    if not json_text_is_storable(text):
        raise _unencodable(data, field, None)
    return text


def encode_all(items: Iterable[Any], field: str = "items") -> list[str]:
    """:func:`encode_data` of every item, one list; the error names the item (``items.3.x``)."""
    items = items if isinstance(items, list | tuple) else list(items)
    encode = _ENCODER.encode
    storable = json_text_is_storable
    try:
        texts = [encode(item) for item in items]
    except (TypeError, ValueError, RecursionError):
        texts = []
    if len(texts) == len(items) and all(storable(text) for text in texts):
        return texts
    # The slow path, only for a batch with a bad item: find it and name it.
    for n, item in enumerate(items):
        encode_data(item, f"{field}.{n}")
    raise InvalidJob(f"{field} cannot be encoded as JSON", field)  # pragma: no cover


def _unencodable(data: Any, field: str, exc: Exception | None) -> InvalidJob:
    """The InvalidJob for data that failed to encode or to pass the storable check."""
    if isinstance(exc, RecursionError):
        return InvalidJob(f"{field} is nested too deeply to encode as JSON", field)
    if isinstance(exc, ValueError) and "Circular reference" in str(exc):
        return InvalidJob(f"{field} contains itself (a circular reference)", field)
    found = find_unstorable(data, field, models=True)
    if found is not None:
        path, problem = found
        return InvalidJob(f"{path} {problem}", path)
    # A value the walk accepts but json refuses: a circular reference, an exotic subclass.
    return InvalidJob(f"{field} is not JSON-serialisable: {exc}", field)


def check_text(name: str, value: Any, *, optional: bool = True) -> None:
    """A queue name, singleton key or timer key: a non-empty str PostgreSQL can store."""
    if value is None and optional:
        return
    if not isinstance(value, str) or not value:
        what = "a non-empty string or None" if optional else "a non-empty string"
        raise InvalidJob(f"{name} must be {what}", name)
    problem = text_problem(value)
    if problem is not None:
        raise InvalidJob(f"{name} {problem}", name)


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
        check_start_after(self.start_after)
        check_text("singleton_key", self.singleton_key)
        _check_int("priority", self.priority, minimum=-(2**31), allow_none=False)
        _check_int("retry_limit", self.retry_limit, minimum=0)
        _check_int("retry_delay", self.retry_delay, minimum=0)
        _check_int("expire_in_seconds", self.expire_in_seconds, minimum=1)
        if self.retry_backoff is not None and not isinstance(self.retry_backoff, bool):
            raise InvalidJob("retry_backoff must be a bool or None", "retry_backoff")

    def values(self) -> dict[str, Any]:
        """The statement parameters shared by send and send_many, by name."""
        delay, at = split_start_after(self.start_after)
        return {
            "priority": self.priority,
            "singleton_key": self.singleton_key,
            "delay": delay,
            "at": at,
            "retry_limit": self.retry_limit,
            "retry_delay": self.retry_delay,
            "retry_backoff": self.retry_backoff,
            "expire_seconds": self.expire_in_seconds,
        }


class SendKwargs(TypedDict, total=False):
    """The per-send options ``send`` and ``send_many`` take as keywords (see
    :class:`SendOptions`): written once for the async and the sync sender."""

    start_after: StartAfter
    singleton_key: str | None
    priority: int
    retry_limit: int | None
    retry_delay: int | None
    retry_backoff: bool | None
    expire_in_seconds: int | None


def split_start_after(
    value: StartAfter, field: str = "start_after"
) -> tuple[float | None, datetime | None]:
    """Split ``start_after`` into (seconds from now, absolute instant) statement parameters."""
    check_start_after(value, field)
    if isinstance(value, datetime):
        return None, value
    if value is None:
        return None, None
    return float(value), None


def check_start_after(value: StartAfter, field: str = "start_after") -> None:
    """A delay of 0 to :data:`MAX_START_AFTER_SECONDS` seconds, an aware datetime PostgreSQL
    can store, or ``None``; :class:`InvalidJob` naming ``field`` otherwise."""
    if value is None:
        return
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidJob(f"{field} must be timezone-aware when given as a datetime", field)
        problem = instant_problem(value)
        if problem is not None:
            raise InvalidJob(f"{field} {problem}", field)
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidJob(f"{field} must be seconds (a number), a datetime or None", field)
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        finite = False
    if not finite or value < 0:
        raise InvalidJob(f"{field} must be a finite, non-negative number of seconds", field)
    if value > MAX_START_AFTER_SECONDS:
        raise InvalidJob(
            f"{field} must be at most {MAX_START_AFTER_SECONDS} seconds (100 years)", field
        )


def _check_int(name: str, value: int | None, *, minimum: int, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJob(f"{name} must be an integer", name)
    if not minimum <= value < 2**31:
        raise InvalidJob(f"{name} must be between {minimum} and {2**31 - 1}", name)


#: The options of a send that gives none (validated once: SendOptions is immutable).
DEFAULT_OPTIONS = SendOptions()


def options_of(given: SendKwargs) -> SendOptions:
    """The :class:`SendOptions` of a send's keywords (the shared default when none is given)."""
    return SendOptions(**given) if given else DEFAULT_OPTIONS
