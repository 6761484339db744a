"""HTTP/1.1 answers written as bytes, for where no HTTP library parsed the request: a head
that never completed (:mod:`.protocol`) and the worker's probe listener (:mod:`.probe_server`)."""

from __future__ import annotations

import json
from http import HTTPStatus


def answer(
    status: int,
    content_type: str,
    body: bytes,
    *,
    head_only: bool = False,
    extra: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """One response that closes its connection (``head_only``: a HEAD's, without the body)."""
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        f"content-type: {content_type}",
        f"content-length: {len(body)}",
        "connection: close",
        *(f"{name}: {value}" for name, value in extra),
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
    return head if head_only else head + body


def head_timeout_answer(seconds: float) -> bytes:
    """The 408 for a request head that did not arrive in time."""
    body = json.dumps(
        {
            "error": f"request headers not received within {seconds:g} seconds",
            "errors": [{"field": "(headers)", "message": "request line and headers too slow"}],
        }
    ).encode()
    return answer(408, "application/json", body)
