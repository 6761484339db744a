"""Reading a /v1 request body: its framing, media type, size, time, encoding, nesting, keys.

Each refusal is an :class:`HttpError` naming the problem: 415 for anything but
``application/json`` in UTF-8, 413 above :data:`MAX_BODY_BYTES`, 408 when the body does not
arrive in time, 400 for a request framed by both Content-Length and Transfer-Encoding, for
text that is not UTF-8, not JSON, nested past :data:`MAX_JSON_DEPTH`, or with an object that
repeats a key (JSON parsers disagree on which copy wins: refused, not guessed). NaN and
Infinity literals are refused too; a number too large for a float (``1e400``) parses as
infinity and is refused, naming its field, by the validation of what it fills.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
from starlette.requests import Request

from api_sender.storable import segment

from .guard import HttpError
from .inputs import is_ascii_digits

#: The largest request body /v1 reads (1 MiB); larger answers 413.
MAX_BODY_BYTES = 1 << 20
#: How deep a /v1 body may nest objects and arrays: far below Python's recursion limit (the
#: parser's), far above any real payload ({"events": [{"dimensions": {...}}]} is 3 deep).
MAX_JSON_DEPTH = 64

_CONTAINERS = (dict, list)


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__("duplicate key")
        self.key = key


async def read_json(request: Request, *, timeout: float) -> Any:
    """The request's JSON body: ``application/json`` (UTF-8), at most :data:`MAX_BODY_BYTES`,
    all of it within ``timeout`` seconds, at most :data:`MAX_JSON_DEPTH` deep, no repeated key.

    The declared Content-Length is checked first, then the bytes actually read, so a chunked
    body or a lying header cannot push more than the limit into memory.
    """
    check_media_type(request.headers.get("content-type"))
    declared = request.headers.get("content-length")
    if declared is not None and "transfer-encoding" in request.headers:
        # RFC 9112 6.3: both framings at once is how requests are smuggled past a proxy.
        raise HttpError(
            400,
            "both Transfer-Encoding and Content-Length: send one",
            headers={"Connection": "close"},
        )
    if declared is not None:
        length = declared.strip()
        if not is_ascii_digits(length):
            raise HttpError(400, "invalid Content-Length: not a number of bytes")
        # Too many digits is too large without int() of them (which refuses 4,300 and more).
        significant = length.lstrip("0") or "0"
        if len(significant) > len(str(MAX_BODY_BYTES)) or int(significant) > MAX_BODY_BYTES:
            raise HttpError(413, "request body too large", limit_bytes=MAX_BODY_BYTES)
    body = bytearray()
    try:
        with anyio.fail_after(timeout):
            async for chunk in request.stream():
                body.extend(chunk)
                if len(body) > MAX_BODY_BYTES:
                    raise HttpError(413, "request body too large", limit_bytes=MAX_BODY_BYTES)
    except TimeoutError:
        # The connection closes after this answer: the rest of that body is not worth waiting for.
        raise HttpError(
            408,
            f"request body not received within {timeout:g} seconds",
            headers={"Connection": "close"},
        ) from None
    if not body:
        raise HttpError(400, "empty body: a JSON object is required")
    return parse_json(bytes(body))


def check_media_type(value: str | None) -> None:
    """415 unless ``value`` is ``application/json``, with no charset or a UTF-8 one (RFC 8259:
    JSON exchanged between systems is UTF-8)."""
    media, _, params = (value or "").partition(";")
    if media.strip().lower() != "application/json":
        raise HttpError(
            415,
            "unsupported media type: send application/json",
            errors=[{"field": "Content-Type", "message": "must be application/json"}],
        )
    for param in params.split(";"):
        name, _, given = param.partition("=")
        if name.strip().lower() == "charset" and given.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            raise HttpError(
                415,
                "unsupported charset: JSON is read as UTF-8",
                errors=[{"field": "Content-Type", "message": "charset must be utf-8"}],
            )


def parse_json(raw: bytes) -> Any:
    """Parse a request body; :class:`HttpError` 400 naming what is wrong with it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HttpError(400, "the body is not UTF-8: JSON must be sent as UTF-8") from None
    too_deep = HttpError(
        400,
        f"JSON nested too deeply: at most {MAX_JSON_DEPTH} levels of objects and arrays",
        errors=[{"field": "(body)", "message": f"nested more than {MAX_JSON_DEPTH} levels"}],
    )
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_refuse_constant)
    except _DuplicateKey as exc:
        raise HttpError(
            400,
            "invalid JSON: an object repeats a key",
            errors=[{"field": segment(exc.key), "message": "this key appears twice in one object"}],
        ) from None
    except RecursionError:
        # The C parser gives up near Python's recursion limit: deeper than ours anyway.
        raise too_deep from None
    except ValueError as exc:
        # json's messages give a position, never the input; ours name the constant.
        raise HttpError(400, f"invalid JSON: {str(exc)[:200]}") from None
    # Two C-speed counts settle most bodies: too few brackets to nest past the limit at all.
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and deeper_than(value, MAX_JSON_DEPTH):
        raise too_deep
    return value


def deeper_than(value: Any, limit: int) -> bool:
    """Whether parsed JSON nests objects and arrays more than ``limit`` levels deep: a walk
    level by level over the containers only (iterative; cheaper than the parse was)."""
    level = [value] if type(value) in _CONTAINERS else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        level = [
            child
            for item in level
            for child in (item.values() if type(item) is dict else item)
            if type(child) in _CONTAINERS
        ]
    return False


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return result


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")
