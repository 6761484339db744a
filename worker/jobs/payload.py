"""Typed payloads: a job's data validated as its declaration's pydantic model, and the
validation error told without the data.

The console shows a job's error even where it hides the job's data, so the text written for a
payload that does not validate keeps pydantic's locations, error types and the messages it
fills from the model (limits, expected values, field names), and never a piece of the input:
the input values themselves, dict keys that came from the data, and any message that may quote
them (a validator's own text, a parser's remark on the input) are withheld.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Container, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticKnownError, core_schema

from api_sender.storable import segment

M = TypeVar("M", bound=BaseModel)

#: What stands in the error text for something taken from the data.
WITHHELD = "[withheld]"
#: A location step that is a key of the data (not a name from the model).
DATA_KEY = "*"
#: How many errors the text lists; the rest are counted.
LISTED = 10

#: Context that pydantic fills from the model, never from the input: safe to show.
_SCHEMA_CONTEXT = frozenset(
    {
        "actual_length",  # a length, not the content
        "attribute",
        "class",
        "class_name",
        "decimal_places",
        "discriminator",
        "encoding",
        "expected",
        "expected_schemes",
        "expected_tags",
        "expected_version",
        "field_type",
        "ge",
        "gt",
        "le",
        "lt",
        "max_digits",
        "max_length",
        "method_name",
        "min_length",
        "multiple_of",
        "pattern",
        "tz_expected",
        "whole_digits",
    }
)
#: Error types whose ``error`` context is the parser's fixed wording ("input is too short",
#: "invalid character in year"), never a piece of the input. Others (``value_error``,
#: ``uuid_parsing``, ``json_invalid``, ...) may quote it.
_FIXED_WORDING = frozenset(
    {
        "date_from_datetime_parsing",
        "date_parsing",
        "datetime_from_date_parsing",
        "datetime_parsing",
        "time_delta_parsing",
        "time_parsing",
        "url_parsing",
        "url_syntax_violation",
    }
)
#: pydantic's own error types: any other type is a validator's own (PydanticCustomError), whose
#: message is the validator's text.
_KNOWN_TYPES = frozenset(typing.get_args(core_schema.ErrorType))

#: Per model, the names its schema gives (fields, aliases, tags), computed once.
_words: dict[type[BaseModel], frozenset[str]] = {}


def validate(model: type[M], raw: str | None) -> M | None:
    """The job's data (its JSON text) as a ``model``, validated in JSON mode (the mode
    ``model_dump(mode="json")`` was written for); no data (a cron run, or a send of ``None``)
    stays ``None``. Raises :class:`pydantic.ValidationError`."""
    if raw is None or raw == "null":
        return None
    return model.model_validate_json(raw)


def describe(exc: ValidationError, model: type[BaseModel], raw: str) -> str:
    """The validation error as the job's error text: each error's location, message and type,
    with nothing taken from the data (``raw``, the job's JSON text)."""
    try:
        return _describe(exc, model, raw)
    except Exception as problem:
        # A schema this walk does not know: say less rather than fail to say it safely.
        return (
            f"payload does not validate as {model.__name__} ({exc.error_count()} errors; "
            f"not described: {type(problem).__name__})"
        )


def _describe(exc: ValidationError, model: type[BaseModel], raw: str) -> str:
    errors = exc.errors(include_url=False, include_input=False)
    words = schema_words(model)
    keys = _keys_of(raw)
    # Data too deep to read back: any step the model does not name may be one of its keys.
    data_keys: Container[str] = _NotIn(words) if keys is None else keys - words
    parts = [
        f"{_location(error['loc'], data_keys)}: {_message(error)} [{error['type']}]"
        for error in errors[:LISTED]
    ]
    if len(errors) > LISTED:
        parts.append(f"and {len(errors) - LISTED} more")
    count = f"{len(errors)} error" + ("" if len(errors) == 1 else "s")
    return f"payload does not validate as {model.__name__} ({count}): " + "; ".join(parts)


def schema_words(model: type[BaseModel]) -> frozenset[str]:
    """Every name ``model``'s schema can put in a location: field names and aliases of the
    models, dataclasses and typed dicts it holds, and the tags of its tagged unions."""
    words = _words.get(model)
    if words is None:
        found: set[str] = set()
        _collect(model.__pydantic_core_schema__, found)
        words = _words[model] = frozenset(found)
    return words


def _collect(schema: Any, found: set[str]) -> None:
    """Walk a core schema (nested dicts and lists), adding the names it defines to ``found``."""
    stack = [schema]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if isinstance(node, list | tuple):
            stack.extend(node)
            continue
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        kind = node.get("type")
        fields = node.get("fields")
        if kind in ("model-fields", "typed-dict") and isinstance(fields, dict):
            found.update(name for name in fields if isinstance(name, str))
        elif kind == "dataclass-args" and isinstance(fields, list):
            found.update(
                f["name"] for f in fields if isinstance(f, dict) and isinstance(f.get("name"), str)
            )
        elif kind == "tagged-union" and isinstance(node.get("choices"), dict):
            found.update(str(tag) for tag in node["choices"])
        for key in ("validation_alias", "serialization_alias", "alias"):
            _strings(node.get(key), found)
        stack.extend(value for value in node.values() if isinstance(value, dict | list | tuple))


def _strings(value: Any, found: set[str]) -> None:
    """The strings of an alias: a name, a path (list), or choices of paths."""
    if isinstance(value, str):
        found.add(value)
    elif isinstance(value, list | tuple):
        for item in value:
            _strings(item, found)


class _NotIn:
    """Contains every string but ``words``."""

    def __init__(self, words: frozenset[str]) -> None:
        self._words = words

    def __contains__(self, item: object) -> bool:
        return item not in self._words


def _keys_of(raw: str) -> set[str] | None:
    """Every object key anywhere in the JSON text ``raw``; ``None`` for text nested too deeply
    for Python's decoder."""
    keys: set[str] = set()
    try:
        stack: list[Any] = [json.loads(raw)]
    except RecursionError:
        return None
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            keys.update(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return keys


def _location(loc: Sequence[int | str], data_keys: Container[str]) -> str:
    """A location as ``items.0.price``; a step that is a key of the data becomes ``*``."""
    if not loc:
        return "payload"
    return ".".join(
        DATA_KEY if isinstance(step, str) and step in data_keys else segment(step) for step in loc
    )


def _message(error: Any) -> str:
    """pydantic's message when it holds only what the model says; else the same message with
    the data's part withheld; a validator's own message is withheld whole."""
    kind = error["type"]
    if kind not in _KNOWN_TYPES:
        return f"{WITHHELD} (a validator's own message)"
    context: dict[str, Any] = error.get("ctx") or {}
    hidden = {
        key
        for key in context
        if key not in _SCHEMA_CONTEXT and not (key == "error" and kind in _FIXED_WORDING)
    }
    if not hidden:
        return str(error["msg"])
    shown = {key: WITHHELD if key in hidden else value for key, value in context.items()}
    try:
        return PydanticKnownError(kind, shown).message()
    except Exception:
        # Context pydantic's template does not take (a validator raised this type with its own
        # message): nothing of it can be shown.
        return f"{WITHHELD} (a validator's own message)"
