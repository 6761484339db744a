"""Values PostgreSQL cannot store (NUL, lone surrogates, non-finite or out-of-range numbers and
instants) are refused by the producer API with InvalidJob naming the field, never a DataError."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import ValidationError

from api_sender import InvalidJob, Sender, UsageEvent
from api_sender.options import MAX_START_AFTER_SECONDS, encode_data
from tests.support.queues import make_queue

#: An instant whose UTC form is past year 9999, and one before year 1.
TOO_LATE = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-1)))
TOO_EARLY = datetime(1, 1, 1, 0, 0, 0, tzinfo=timezone(timedelta(hours=1)))


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"name": "a\x00b"}, "data.name"),
        ({"name": "a\ud800b"}, "data.name"),
        ({"name": "\udc00"}, "data.name"),
        ({"k\x00": 1}, "data.k\\u0000"),
        ({"list": [1, {"deep": "x\x00"}]}, "data.list.1.deep"),
        ({"big": math.inf}, "data.big"),
        ({"nan": [math.nan]}, "data.nan.0"),
        ("\x00", "data"),
    ],
)
async def test_send_refuses_unstorable_data_naming_the_field(
    pool, sender: Sender, data: Any, field: str
) -> None:
    """NUL, lone surrogates and non-finite floats anywhere in the data raise InvalidJob whose
    field is the path to the value, and nothing is stored."""
    await make_queue(pool, "q")
    with pytest.raises(InvalidJob) as caught:
        await sender.send("q", data)
    assert caught.value.field == field
    assert field in str(caught.value)
    with pytest.raises(InvalidJob) as many:
        await sender.send_many("q", [{"ok": 1}, data])
    assert many.value.field == "items.1" + field.removeprefix("data")
    assert await pool.fetchval("SELECT count(*) FROM jobs.job") == 0


async def test_text_that_only_looks_like_an_escape_is_stored(pool, sender: Sender) -> None:
    """A literal backslash-u0000, valid surrogate pairs (emoji) and other control characters are
    stored unchanged: the check refuses only what PostgreSQL cannot hold."""
    await make_queue(pool, "q")
    data = {"text": "\\u0000 \\ud800", "emoji": "\U0001f600", "bell": "\x07", "é": "ü"}
    job_id = await sender.send("q", data)
    [stored] = await sender.send_many("q", [data])
    rows = await pool.fetch(
        "SELECT data::text AS data FROM jobs.job WHERE id = ANY($1::bigint[])", [job_id, stored]
    )
    assert [json.loads(r["data"]) for r in rows] == [data, data]


def test_deeply_nested_data_is_invalid_job() -> None:
    """Data nested past the JSON encoder's reach raises InvalidJob, not RecursionError."""
    data: Any = []
    for _ in range(100_000):
        data = [data]
    with pytest.raises(InvalidJob, match="nested too deeply"):
        encode_data(data)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"singleton_key": "k\x00"}, "singleton_key"),
        ({"singleton_key": "k\ud800"}, "singleton_key"),
        ({"start_after": 1e13}, "start_after"),
        ({"start_after": 1e308}, "start_after"),
        ({"start_after": MAX_START_AFTER_SECONDS + 1}, "start_after"),
        ({"start_after": TOO_LATE}, "start_after"),
        ({"start_after": TOO_EARLY}, "start_after"),
    ],
)
async def test_send_refuses_unstorable_options_naming_them(
    pool, sender: Sender, kwargs: dict[str, Any], field: str
) -> None:
    """Keys with NUL or lone surrogates and delays or instants outside what the database can
    hold raise InvalidJob naming the option, for send and send_many; nothing is stored."""
    await make_queue(pool, "q")
    with pytest.raises(InvalidJob) as caught:
        await sender.send("q", {}, **kwargs)
    assert caught.value.field == field
    with pytest.raises(InvalidJob):
        await sender.send_many("q", [{}], **kwargs)
    assert await pool.fetchval("SELECT count(*) FROM jobs.job") == 0


async def test_the_limits_themselves_are_accepted(pool, sender: Sender) -> None:
    """The longest delay allowed and the last representable instants are stored."""
    await make_queue(pool, "q")
    assert await sender.send("q", {}, start_after=MAX_START_AFTER_SECONDS) is not None
    last = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
    assert await sender.send("q", {}, start_after=last) is not None
    assert await sender.timers.schedule("q", at=datetime(1, 1, 1, tzinfo=UTC)) is not None


@pytest.mark.parametrize(
    ("call", "field"),
    [
        ({"queue": "q\x00"}, "queue"),
        ({"queue": "q\ud800"}, "queue"),
        ({"singleton_keys": ["ok", "k\x00"]}, "singleton_keys.1"),
    ],
)
async def test_queue_names_and_per_item_keys_are_checked(
    pool, sender: Sender, call: dict[str, Any], field: str
) -> None:
    """A NUL or lone surrogate in a queue name or in one of singleton_keys is InvalidJob."""
    await make_queue(pool, "q")
    queue = call.get("queue", "q")
    keys = call.get("singleton_keys")
    with pytest.raises(InvalidJob) as caught:
        await sender.send_many(queue, [{}, {}], singleton_keys=keys)
    assert caught.value.field == field
    if keys is None:
        with pytest.raises(InvalidJob):
            await sender.send(queue, {})
    assert await pool.fetchval("SELECT count(*) FROM jobs.job") == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"delay_seconds": 1e13}, "delay_seconds"),
        ({"delay_seconds": math.inf}, "delay_seconds"),
        ({"at": TOO_LATE}, "at"),
        ({"at": TOO_EARLY}, "at"),
        ({"delay_seconds": 1, "key": "k\x00"}, "key"),
        ({"delay_seconds": 1, "key": "\ud800"}, "key"),
        ({"delay_seconds": 1, "data": {"x": "\x00"}}, "data.x"),
        ({"delay_seconds": 1, "queue": "t\x00"}, "queue"),
    ],
)
async def test_timers_refuse_unstorable_values(
    pool, sender: Sender, kwargs: dict[str, Any], field: str
) -> None:
    """Timer delays, instants, keys, data and queue names that cannot be stored raise
    InvalidJob naming the argument; nothing is stored."""
    await make_queue(pool, "t")
    queue = kwargs.pop("queue", "t")
    with pytest.raises(InvalidJob) as caught:
        await sender.timers.schedule(queue, **kwargs)
    assert caught.value.field == field
    assert await pool.fetchval("SELECT count(*) FROM jobs.job") == 0


@pytest.mark.parametrize(
    ("queue", "key", "field"),
    [("t\x00", "k", "queue"), ("t", "k\x00", "key"), ("t", "\ud800", "key")],
)
async def test_timer_cancel_refuses_unstorable_names(
    pool, sender: Sender, queue: str, key: str, field: str
) -> None:
    """Cancelling with a NUL or lone surrogate in the queue or key raises InvalidJob."""
    await make_queue(pool, "t")
    with pytest.raises(InvalidJob) as caught:
        await sender.timers.cancel(queue, key)
    assert caught.value.field == field


def _event_errors(**data: Any) -> dict[str, str]:
    with pytest.raises(ValidationError) as caught:
        UsageEvent.model_validate({"meter": "m", "quantity": 1, "workspace_id": "w", **data})
    return {".".join(map(str, e["loc"])): e["msg"] for e in caught.value.errors()}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"meter": "m\x00"}, "meter"),
        ({"meter": "\ud800"}, "meter"),
        ({"workspace_id": "w\x00"}, "workspace_id"),
        ({"workspace_id": "w\udfff"}, "workspace_id"),
        ({"dimensions": {"region": "eu\x00"}}, "dimensions"),
        ({"dimensions": {"k\x00": 1}}, "dimensions"),
        ({"dimensions": {"deep": [{"x": "\ud800"}]}}, "dimensions"),
        ({"dimensions": {"big": math.inf}}, "dimensions"),
        ({"dimensions": {"set": {1, 2}}}, "dimensions"),
        ({"occurred_at": TOO_LATE}, "occurred_at"),
        ({"occurred_at": "9999-12-31T23:59:59-01:00"}, "occurred_at"),
        ({"occurred_at": "0001-01-01T00:00:00+01:00"}, "occurred_at"),
    ],
)
def test_usage_event_refuses_unstorable_fields(data: dict[str, Any], field: str) -> None:
    """A usage event with NUL, lone surrogates, non-finite or non-JSON dimension values, or an
    instant outside years 1-9999 in UTC is a ValidationError on that field."""
    errors = _event_errors(**data)
    assert set(errors) == {field}, errors


def test_usage_event_names_the_dimension_path() -> None:
    """The message of a bad dimension names its path inside dimensions."""
    errors = _event_errors(dimensions={"deep": [{"x": "\x00"}]})
    assert "dimensions.deep.0.x" in errors["dimensions"]


def test_a_usage_event_without_occurred_at_is_still_now() -> None:
    """In Python, occurred_at stays optional (now, UTC)."""
    event = UsageEvent("m", 1, "w")
    assert abs(event.occurred_at - datetime.now(UTC)) < timedelta(seconds=5)
