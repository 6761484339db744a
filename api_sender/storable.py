"""What PostgreSQL can store: text without NUL or lone surrogates, finite numbers, instants it
can represent. Shared by the payload encoder, the send options and the usage event model.

The checks on the hot path (:func:`json_text_is_storable`) look at encoded text once; walking a
value (:func:`find_unstorable`) happens only to name the field once something is wrong, or for
the small objects (usage dimensions) that are always walked.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

#: A lone UTF-16 surrogate: a str can hold one (e.g. from JSON ``"\ud800"``), UTF-8 cannot.
_SURROGATE = re.compile("[\ud800-\udfff]")
#: ``\u0000`` as a JSON escape: preceded by an even run of backslashes (each pair an escaped
#: backslash), so the text ``\\u0000`` (a backslash, then "u0000") does not match.
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
#: The longest piece of caller input quoted in a field path (paths are echoed in errors).
_SEGMENT_CHARS = 40
#: The nesting a walk follows before it calls a value too deep (or circular).
WALK_DEPTH = 10_000

NUL_MESSAGE = "contains a NUL character (\\u0000), which PostgreSQL cannot store"
SURROGATE_MESSAGE = "contains a lone UTF-16 surrogate, which is not valid Unicode"


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as PostgreSQL text, or ``None`` when it can."""
    if "\x00" in value:
        return NUL_MESSAGE
    # isascii() is O(1) on CPython: ASCII text, the usual case, skips the search.
    if not value.isascii() and _SURROGATE.search(value) is not None:
        return SURROGATE_MESSAGE
    return None


def json_text_is_storable(text: str) -> bool:
    """Whether JSON text (from ``ensure_ascii=False``) can become jsonb: no escaped NUL and no
    lone surrogate. One pass over ``text``; a walk names the culprit when this says no."""
    if "\\u0000" in text and _ESCAPED_NUL.search(text) is not None:
        return False
    return text.isascii() or _SURROGATE.search(text) is None


def instant_problem(value: datetime) -> str | None:
    """Why an aware datetime cannot be a timestamptz: its UTC form must fall in years 1-9999."""
    try:
        value.astimezone(UTC)
    except OverflowError:
        return "must fall between 0001-01-01 and 9999-12-31 (UTC)"
    return None


def segment(key: object) -> str:
    """One step of a field path, safe to echo: escaped like JSON, long keys shortened."""
    raw = key if isinstance(key, str) else str(key)
    text = json.dumps(raw[:_SEGMENT_CHARS])[1:-1]
    return text + "..." if len(raw) > _SEGMENT_CHARS else text


#: A field path as a linked list, (parent, key or index): walking deep values stays linear,
#: and a step is formatted (:func:`segment`) only when a problem is reported.
_Path = tuple[Any, object] | None


def join(path: _Path) -> str:
    """A field path as text, ``data.items.3.name``; very deep paths keep their two ends."""
    steps: list[str] = []
    while path is not None:
        path, step = path
        # The root is the caller's own name for the value (``data``, ``items.3``): kept as is.
        steps.append(str(step) if path is None else segment(step))
    steps.reverse()
    if len(steps) > 12:
        steps = [*steps[:6], "...", *steps[-5:]]
    return ".".join(steps)


def find_unstorable(
    value: Any, root: str, *, max_depth: int = WALK_DEPTH, models: bool = False
) -> tuple[str, str] | None:
    """The first (field path, problem) that keeps ``value`` from being stored as jsonb: a
    NUL or lone surrogate in a string or key, a non-finite float, a non-JSON type, nesting past
    ``max_depth``. ``None`` when every part is storable. Iterative: no recursion limit. With
    ``models``, a pydantic model is walked as its ``model_dump(mode="json")`` (as a payload is
    sent); without, it is not a JSON value."""
    stack: list[tuple[Any, _Path, int]] = [(value, (None, root), 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                return join(path), problem
        elif isinstance(item, bool) or item is None or isinstance(item, int):
            continue
        elif isinstance(item, float):
            if not math.isfinite(item):
                return join(path), "must be a finite number (JSON has no NaN or Infinity)"
        elif depth >= max_depth and isinstance(item, Mapping | list | tuple):
            return join(path), f"is nested more than {max_depth} levels deep"
        elif isinstance(item, Mapping):
            children: list[tuple[Any, _Path, int]] = []
            for key, child in item.items():
                where = (path, key)
                if isinstance(key, str):
                    problem = text_problem(key)
                    if problem is not None:
                        return join(where), f"key {problem}"
                elif isinstance(key, float) and not math.isfinite(key):
                    return join(where), "key must be a finite number"
                elif not (key is None or isinstance(key, int | float)):
                    return join(where), f"key of type {type(key).__name__} is not a JSON key"
                children.append((child, where, depth + 1))
            stack.extend(reversed(children))
        elif isinstance(item, list | tuple):
            stack.extend(
                (child, (path, n), depth + 1) for n, child in reversed(list(enumerate(item)))
            )
        elif models and isinstance(item, BaseModel):
            # A model is sent as its JSON dump: walk that, at the model's own path.
            try:
                dumped = item.model_dump(mode="json")
            except Exception as exc:
                return join(path), f"cannot be dumped as JSON ({type(exc).__name__})"
            stack.append((dumped, path, depth))
        else:
            return join(path), f"is not a JSON value (type {type(item).__name__})"
    return None
