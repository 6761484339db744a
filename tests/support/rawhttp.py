"""HTTP/1.1 over a bare socket: for requests no HTTP client would send (slow, lying, broken)."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RawAnswer:
    """What came back on one connection."""

    #: The status of the first response, ``None`` when the server sent none.
    status: int | None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    #: Whether the server closed (or reset) the connection.
    closed: bool = False
    #: Whether we gave up waiting: neither an answer nor a close came in time.
    hung: bool = False
    #: Seconds from the connect to the answer or close.
    seconds: float = 0.0

    def json(self) -> Any:
        """The body as JSON (``None`` when it is not)."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None


def request_head(
    method: str, path: str, headers: dict[str, str] | None = None, *, host: str = "127.0.0.1"
) -> bytes:
    """A request line and headers, ending with the blank line."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def exchange(
    port: int,
    parts: Sequence[bytes],
    *,
    pause: float = 0.0,
    timeout: float = 30.0,
    close_after_send: bool = False,
) -> RawAnswer:
    """Connect, send ``parts`` with ``pause`` seconds between them (stopping early once the
    server answers or closes), then read one response until it is complete, the server closes,
    or ``timeout`` runs out (``hung``). ``close_after_send`` hangs up without reading."""
    began = time.monotonic()
    deadline = began + timeout
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    received = bytearray()
    closed = False
    try:
        for n, part in enumerate(parts):
            if part:
                try:
                    sock.sendall(part)
                except OSError:
                    break
            if n < len(parts) - 1 and pause > 0:
                readable, _, _ = select.select([sock], [], [], pause)
                if readable:
                    break
        if close_after_send:
            return RawAnswer(None, closed=True, seconds=time.monotonic() - began)
        while not _complete(received):
            left = deadline - time.monotonic()
            if left <= 0:
                return _answer(received, closed=False, hung=True, began=began)
            sock.settimeout(left)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                return _answer(received, closed=False, hung=True, began=began)
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            received.extend(chunk)
        split = _split(received)
        if not closed and split is not None and split[1].get("connection") == "close":
            closed = _closes(sock, min(5.0, max(0.1, deadline - time.monotonic())))
        return _answer(received, closed=closed, hung=False, began=began)
    finally:
        sock.close()


def _closes(sock: socket.socket, wait: float) -> bool:
    """Whether the server closes the connection within ``wait`` seconds of an answer that
    said it would (``Connection: close``)."""
    sock.settimeout(wait)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _split(received: bytes) -> tuple[int | None, dict[str, str], bytes] | None:
    head, sep, body = received.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


def _complete(received: bytes) -> bool:
    split = _split(received)
    if split is None:
        return False
    _, headers, body = split
    length = headers.get("content-length")
    return length is not None and len(body) >= int(length)


def _answer(received: bytes, *, closed: bool, hung: bool, began: float) -> RawAnswer:
    split = _split(received)
    seconds = time.monotonic() - began
    if split is None:
        return RawAnswer(None, closed=closed, hung=hung, seconds=seconds)
    status, headers, body = split
    length = headers.get("content-length")
    if length is not None:
        body = body[: int(length)]
    return RawAnswer(status, headers, body, closed=closed, hung=hung, seconds=seconds)
