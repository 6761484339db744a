"""The usage event model: ids, quantities, timestamps, dimensions, field-level errors."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from api_sender import UsageEvent


def _field_errors(**data: object) -> dict[str, str]:
    with pytest.raises(ValidationError) as caught:
        UsageEvent.model_validate(data)
    return {".".join(map(str, e["loc"])): e["msg"] for e in caught.value.errors()}


def test_absent_id_is_a_fresh_ulid_readable_at_once() -> None:
    """An event built without an id gets a distinct 26-character ULID, and now (UTC) as time."""
    a = UsageEvent(meter="api.calls", quantity=1, workspace_id="w1")
    b = UsageEvent("api.calls", 1, "w1")
    assert len(a.id) == 26
    assert a.id != b.id
    assert a.occurred_at.tzinfo is not None
    assert abs(a.occurred_at - datetime.now(UTC)) < timedelta(seconds=5)


def test_given_ulid_is_kept_and_normalised() -> None:
    """A lower-case ULID is accepted and stored upper-case; a non-ULID id is refused."""
    event = UsageEvent("m", 1, "w", id="01hzy8k5v3q9m2n7p4r6t8w0xa")
    assert event.id == "01HZY8K5V3Q9M2N7P4R6T8W0XA"
    assert "id" in _field_errors(meter="m", quantity=1, workspace_id="w", id="not-a-ulid")
    assert "id" in _field_errors(
        meter="m", quantity=1, workspace_id="w", id="81HZY8K5V3Q9M2N7P4R6T8W0XA"
    )


@pytest.mark.parametrize("quantity", [-1, math.nan, math.inf, -math.inf, "3", True, None, 10**400])
def test_quantity_must_be_finite_and_non_negative(quantity: object) -> None:
    """Negative, NaN, infinite, huge, boolean, textual and missing quantities are refused."""
    assert "quantity" in _field_errors(meter="m", quantity=quantity, workspace_id="w")


def test_zero_and_fractional_quantities_are_fine() -> None:
    """Zero and fractions are valid quantities."""
    assert UsageEvent("m", 0, "w").quantity == 0
    assert UsageEvent("m", 2.5, "w").quantity == 2.5


@pytest.mark.parametrize(
    "value",
    ["2024-05-01T12:00:00", "2024-05-01", "yesterday", "20240501T120000+0100", 1714564800],
)
def test_occurred_at_must_be_rfc3339_with_offset(value: object) -> None:
    """Naive, date-only, basic-format, textual and numeric timestamps are refused."""
    assert "occurred_at" in _field_errors(
        meter="m", quantity=1, workspace_id="w", occurred_at=value
    )


def test_occurred_at_keeps_its_offset() -> None:
    """An RFC 3339 time with an offset (or Z, or a fraction) is parsed as that instant."""
    event = UsageEvent("m", 1, "w", occurred_at="2024-05-01T12:00:00.5+02:00")
    assert event.occurred_at == datetime(2024, 5, 1, 10, 0, 0, 500000, tzinfo=UTC)
    assert event.occurred_at.utcoffset() == timezone(timedelta(hours=2)).utcoffset(None)
    assert UsageEvent("m", 1, "w", occurred_at="2024-05-01T12:00:00Z").occurred_at.tzinfo


def test_every_invalid_field_is_named_and_extras_are_refused() -> None:
    """All invalid fields are reported at once, unknown fields and bad dimensions included."""
    errors = _field_errors(meter="", quantity=-2, workspace_id="", dimensions=[1], colour="red")
    assert {"meter", "quantity", "workspace_id", "dimensions", "colour"} <= set(errors)


def test_job_data_round_trips() -> None:
    """The queue payload carries every field in JSON form and validates back to the same event."""
    event = UsageEvent("m", 3, "w", dimensions={"region": "eu"})
    data = event.to_job_data()
    assert data["occurred_at"].endswith("+00:00")
    assert UsageEvent.model_validate(data) == event
