"""Typed payloads: models sent as their JSON dump, handlers given their model, and data that
does not validate failed at once to its dead letter with an error that quotes none of it."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, cast

import asyncpg
import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from api_sender import InvalidJob, Sender
from tests.queue.test_poller import run_until
from tests.support.queues import make_queue
from worker import JobDeclaration, JobInfo, QueueOptions
from worker.jobs.payload import describe, validate
from worker.jobs.spec import JobContext
from worker.jobs.tools import tool_job

#: What a payload hides in its bad values: never to be seen in an error or a log line.
SECRET = "Zq7Secret-alice@example.org-Xv9Token"
#: Pieces of it that would give part of it away.
PIECES = ("Zq7", "Xv9", "alice", "example.org", SECRET)


class Line(BaseModel):
    """An order line: a three-letter code and a positive quantity."""

    sku: str = Field(pattern=r"^[A-Z]{3}$")
    qty: int = Field(gt=0)


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int


class Dog(BaseModel):
    kind: Literal["dog"]
    bark: str


class Order(BaseModel):
    """A payload with a value of each kind pydantic checks differently."""

    model_config = ConfigDict(extra="forbid")

    number: int
    currency: Literal["EUR", "USD"]
    ref: uuid.UUID
    issued_at: datetime
    lines: list[Line]
    counts: dict[str, int]
    pet: Annotated[Cat | Dog, Field(discriminator="kind")]
    note: str
    code: str

    @field_validator("note")
    @classmethod
    def _note_is_allowed(cls, value: str) -> str:
        if "Secret" in value:
            raise ValueError(f"note {value!r} is not allowed")
        return value

    @field_validator("code")
    @classmethod
    def _code_is_known(cls, value: str) -> str:
        if "Secret" in value:
            raise PydanticCustomError("bad_code", "code {code} is unknown", {"code": value})
        return value


def good_order() -> dict[str, Any]:
    """A valid Order as JSON data."""
    return {
        "number": 7,
        "currency": "EUR",
        "ref": str(uuid.UUID(int=7)),
        "issued_at": "2026-12-01T10:00:00Z",
        "lines": [{"sku": "ABC", "qty": 2}],
        "counts": {"a": 1},
        "pet": {"kind": "cat", "lives": 9},
        "note": "fine",
        "code": "c1",
    }


def assert_no_secret(text: str) -> None:
    """No piece of SECRET is in ``text``."""
    found = [piece for piece in PIECES if piece in text]
    assert not found, f"{found} quoted in {text!r}"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"number": SECRET}, "number: Input should be a valid integer"),
        ({"currency": SECRET}, "currency: Input should be 'EUR' or 'USD' [literal_error]"),
        ({"ref": SECRET}, "ref: Input should be a valid UUID, [withheld] [uuid_parsing]"),
        ({"issued_at": SECRET}, "issued_at: Input should be a valid datetime"),
        ({"lines": [{"sku": SECRET, "qty": 1}]}, "lines.0.sku: String should match pattern"),
        ({"lines": [{"sku": "ABC", "qty": -1}]}, "lines.0.qty: Input should be greater than 0"),
        ({"counts": {SECRET: SECRET}}, "counts.*: Input should be a valid integer"),
        ({SECRET: 1}, "*: Extra inputs are not permitted [extra_forbidden]"),
        (
            {"pet": {"kind": SECRET}},
            "pet: Input tag '[withheld]' found using 'kind' does not match any of the expected "
            "tags: 'cat', 'dog' [union_tag_invalid]",
        ),
        ({"pet": {"kind": "dog", "bark": 1}}, "pet.dog.bark: Input should be a valid string"),
        ({"note": SECRET}, "note: Value error, [withheld] [value_error]"),
        ({"code": SECRET}, "code: [withheld] (a validator's own message) [bad_code]"),
    ],
)
def test_the_error_text_names_the_problem_and_quotes_no_data(
    change: dict[str, Any], expected: str
) -> None:
    """Each kind of invalid value is described by its location, pydantic's message as far as
    the model fills it, and its type; the value, a key from the data and a validator's own
    text (which may quote the value) are withheld, though pydantic's own text quotes them."""
    raw = json.dumps({**good_order(), **change})
    with pytest.raises(ValidationError) as caught:
        validate(Order, raw)
    if SECRET in json.dumps(change):
        assert SECRET in str(caught.value)  # what pydantic's own text would show
    text = describe(caught.value, Order, raw)
    assert text.startswith("payload does not validate as Order (1 error): "), text
    assert expected in text
    assert_no_secret(text)


def test_data_that_is_not_an_object_and_many_errors_are_described() -> None:
    """A payload that is a bare string is one error at the payload itself; a payload with a
    dozen bad lines lists ten errors and counts the rest."""
    raw = json.dumps(SECRET)
    with pytest.raises(ValidationError) as caught:
        validate(Order, raw)
    text = describe(caught.value, Order, raw)
    assert "(1 error): payload: " in text
    assert "[model_type]" in text
    assert_no_secret(text)
    raw = json.dumps({**good_order(), "lines": [{"sku": SECRET, "qty": 1}] * 12})
    with pytest.raises(ValidationError) as caught:
        validate(Order, raw)
    text = describe(caught.value, Order, raw)
    assert "(12 errors)" in text
    assert text.endswith("; and 2 more")
    assert text.count("[string_pattern_mismatch]") == 10
    assert_no_secret(text)


def test_no_data_stays_none_and_json_forms_validate() -> None:
    """A job without data (a cron run's NULL, or a sent None) validates to None; ISO instants
    and UUID strings, as model_dump(mode="json") writes them, validate to their types."""
    assert validate(Order, None) is None
    assert validate(Order, "null") is None
    order = validate(Order, json.dumps(good_order()))
    assert order is not None
    assert order.issued_at == datetime(2026, 12, 1, 10, tzinfo=UTC)
    assert order.ref == uuid.UUID(int=7)


def test_a_declaration_refuses_a_payload_that_is_not_a_complete_model() -> None:
    """payload must be a pydantic model class whose annotations all resolve: anything else is
    refused when the declaration is made, naming the queue."""

    async def handler(data: Any, job: JobInfo) -> None:
        return None

    with pytest.raises(ValueError, match=r"JobDeclaration\('q'\)\.payload must be a pydantic"):
        JobDeclaration(queue="q", handler=handler, payload=dict)
    with pytest.raises(ValueError, match="pydantic model class"):
        JobDeclaration(queue="q", handler=handler, payload=Order(**good_order()))

    class Dangling(BaseModel):
        child: Undefined  # noqa: F821

    with pytest.raises(ValueError, match=r"payload Dangling is not fully defined"):
        JobDeclaration(queue="q", handler=handler, payload=Dangling)
    assert JobDeclaration(queue="q", handler=handler, payload=Order).payload is Order


async def test_send_accepts_models_as_their_json_dump(pool: asyncpg.Pool, sender: Sender) -> None:
    """send and send_many take pydantic models (alone, or inside the data) and store
    model_dump(mode="json"): instants and UUIDs as strings."""
    await make_queue(pool, "q")
    order = Order.model_validate(good_order())
    one = await sender.send("q", order)
    many = await sender.send_many("q", [order, Line(sku="XYZ", qty=1)])
    nested = await sender.send("q", {"line": Line(sku="ABC", qty=3), "n": 1})
    rows = await pool.fetch(
        "SELECT id, data::text AS data FROM jobs.job WHERE id = ANY($1::bigint[])",
        [one, *many, nested],
    )
    stored = {r["id"]: json.loads(r["data"]) for r in rows}
    assert stored[one] == order.model_dump(mode="json") == good_order()
    assert stored[many[0]] == good_order()
    assert stored[many[1]] == {"sku": "XYZ", "qty": 1}
    assert stored[nested] == {"line": {"sku": "ABC", "qty": 3}, "n": 1}


async def test_a_model_holding_unstorable_text_is_refused_naming_the_field(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """A model whose dump holds a NUL is refused with InvalidJob naming the field, as plain
    data is, and nothing is stored."""
    await make_queue(pool, "q")
    bad = Line.model_construct(sku="A\x00B", qty=1)
    with pytest.raises(InvalidJob) as one:
        await sender.send("q", bad)
    assert one.value.field == "data.sku"
    with pytest.raises(InvalidJob) as many:
        await sender.send_many("q", [Line(sku="ABC", qty=1), bad])
    assert many.value.field == "items.1.sku"
    assert await pool.fetchval("SELECT count(*) FROM jobs.job") == 0


async def test_a_typed_consumer_hands_over_models_and_fails_bad_data_once(
    pool: asyncpg.Pool, sender: Sender, captured_logs
) -> None:
    """Through a declaration's consumer: a sent model reaches the handler as that model, no
    data as None; data that does not validate never reaches it and fails on its first attempt,
    with five retries left, to its dead letter, logged job.payload_invalid, with no piece of the
    data in its error or in any log line."""
    await make_queue(pool, "dead")
    await make_queue(pool, "typed", retry_limit=5, dead_letter="dead")
    seen: dict[int, object] = {}

    async def handler(data: Order | None, job: JobInfo) -> None:
        seen[job.id] = data

    declaration = JobDeclaration(
        queue="typed",
        handler=handler,
        payload=Order,
        options=QueueOptions(retry_limit=5, dead_letter="dead"),
    )
    consumer = tool_job(declaration).make_consumer(cast(JobContext, None))
    good = await sender.send("typed", Order.model_validate(good_order()))
    empty = await sender.send("typed", None)
    bad = await sender.send("typed", {**good_order(), "number": SECRET})

    async def settled() -> bool:
        rows = await pool.fetch("SELECT state::text AS s FROM jobs.job WHERE queue = 'typed'")
        return all(r["s"] in ("completed", "failed") for r in rows)

    await run_until(pool, consumer, settled)
    assert set(seen) == {good, empty}
    assert isinstance(seen[good], Order)
    assert seen[good] == Order.model_validate(good_order())
    assert seen[empty] is None
    row = await pool.fetchrow(
        "SELECT state::text AS state, attempt, retry_count, output->>'error' AS error"
        " FROM jobs.job WHERE id = $1",
        bad,
    )
    assert row is not None
    assert (row["state"], row["attempt"], row["retry_count"]) == ("failed", 1, 1)
    assert row["error"].startswith("payload does not validate as Order (1 error): number: ")
    assert_no_secret(row["error"])
    copies = await pool.fetch("SELECT data->>'number' AS n FROM jobs.job WHERE queue = 'dead'")
    assert [c["n"] for c in copies] == [SECRET]
    [event] = [e for e in captured_logs if e["event"] == "job.payload_invalid"]
    assert (event["job_id"], event["queue"], event["attempt"]) == (bad, "typed", 1)
    assert event["error"] == row["error"]
    assert_no_secret(repr(captured_logs))
