"""The usage event: what a SaaS records and the billing hub receives."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from ulid import ULID

from .storable import find_unstorable, instant_problem, text_problem

#: Crockford base32, 26 characters, first character at most 7 (128 bits).
_ULID_ALPHABET = frozenset("0123456789ABCDEFGHJKMNPQRSTVWXYZ")
#: RFC 3339 date-time: full date, full time with seconds, optional fraction, a mandatory offset.
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:[Zz]|[+-]\d{2}:\d{2})"
)
#: How deep dimensions may nest: they are labels, and the hub receives them as they are.
DIMENSIONS_DEPTH = 32


def new_ulid() -> str:
    """A new ULID, as its canonical 26-character string."""
    return str(ULID())


def parse_timestamp(value: Any, name: str = "timestamp") -> datetime:
    """A timezone-aware datetime from an RFC 3339 string (or an aware datetime); ``ValueError``
    naming ``name`` otherwise."""
    if isinstance(value, str):
        text = value.strip()
        if not _RFC3339.fullmatch(text):
            raise ValueError(
                f"{name} must be an RFC 3339 timestamp with an offset, e.g. 2024-05-01T12:00:00Z"
            )
        try:
            value = datetime.fromisoformat(text.upper().replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{name} must be an RFC 3339 timestamp") from None
    if not isinstance(value, datetime):
        raise ValueError(f"{name} must be an RFC 3339 timestamp")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must carry a timezone offset")
    problem = instant_problem(value)
    if problem is not None:
        raise ValueError(f"{name} {problem}")
    return value


class UsageEvent(BaseModel):
    """One usage record. ``id`` (a ULID) is generated when absent and readable at once.

    ``quantity`` is a finite, non-negative number; ``occurred_at`` is timezone-aware (now, in UTC,
    when absent). Unknown fields are refused.
    """

    # Built on first use: a process that only sends jobs (a worker) never pays for the schema.
    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=True, defer_build=True
    )

    meter: str = Field(min_length=1, max_length=200)
    quantity: float
    workspace_id: str = Field(min_length=1, max_length=200)
    id: str = Field(default_factory=new_ulid)
    occurred_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    dimensions: dict[str, Any] | None = None

    def __init__(
        self,
        meter: str | None = None,
        quantity: float | None = None,
        workspace_id: str | None = None,
        /,
        **data: Any,
    ) -> None:
        # Positional meter, quantity, workspace_id as the contract shows them; keywords also work.
        for name, value in (
            ("meter", meter),
            ("quantity", quantity),
            ("workspace_id", workspace_id),
        ):
            if value is not None:
                data[name] = value
        super().__init__(**data)

    @field_validator("meter", "workspace_id")
    @classmethod
    def _text_is_storable(cls, value: str, info: ValidationInfo) -> str:
        problem = text_problem(value)
        if problem is not None:
            raise ValueError(f"{info.field_name} {problem}")
        return value

    @field_validator("id", mode="before")
    @classmethod
    def _id_is_ulid(cls, value: Any) -> Any:
        if value is None:
            return new_ulid()
        if not isinstance(value, str):
            raise ValueError("id must be a ULID string")
        candidate = value.strip().upper()
        if len(candidate) != 26 or not set(candidate) <= _ULID_ALPHABET or candidate[0] > "7":
            raise ValueError("id must be a 26-character ULID (Crockford base32)")
        return candidate

    @field_validator("quantity", mode="before")
    @classmethod
    def _quantity_is_a_number(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("quantity must be a number")
        try:
            finite = math.isfinite(value)
        except OverflowError:  # an integer too large for a float
            finite = False
        if not finite:
            raise ValueError("quantity must be finite")
        if value < 0:
            raise ValueError("quantity must not be negative")
        return value

    @field_validator("occurred_at", mode="before")
    @classmethod
    def _occurred_at_is_aware(cls, value: Any) -> Any:
        if value is None:
            return datetime.now(UTC)
        return parse_timestamp(value, "occurred_at")

    @field_validator("dimensions", mode="before")
    @classmethod
    def _dimensions_is_object(cls, value: Any) -> Any:
        if value is None:
            return value
        if not isinstance(value, dict):
            raise ValueError("dimensions must be an object")
        # Walked whole: a value the queue cannot store would fail the send, after the caller
        # was told the event is fine (emit never raises; ingest would answer 500).
        found = find_unstorable(value, "dimensions", max_depth=DIMENSIONS_DEPTH)
        if found is not None:
            path, problem = found
            raise ValueError(f"{path} {problem}")
        return value

    def to_job_data(self) -> dict[str, Any]:
        """The JSON object the queue carries and the hub receives for this event."""
        data: dict[str, Any] = {
            "id": self.id,
            "meter": self.meter,
            "quantity": self.quantity,
            "occurred_at": self.occurred_at.isoformat(),
            "workspace_id": self.workspace_id,
        }
        if self.dimensions is not None:
            data["dimensions"] = self.dimensions
        return data
