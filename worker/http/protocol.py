"""uvicorn's h11 protocol with the two deadlines it lacks, and the refusals h11 cannot make.

uvicorn bounds only the idle time between requests (``timeout_keep_alive``). A client that
opens a connection and sends nothing, dribbles its headers, or announces a body it never sends
would hold its connection for ever. Here every connection waiting for a request head has
``header_timeout`` seconds to complete it (then a 408 if part of a head came, else a close), and
every request body must be in within ``body_timeout`` seconds of its head. The app answers a
late /v1 body with a JSON 408 itself (``worker/http/body.py``); this protocol's body deadline, a
moment later, is the backstop for everything else: a body nobody reads (an early 401/413,
/metrics with a body) is not waited on longer than that either.

Two requests are refused here, before the app sees them, since only the bytes tell:

- a chunked body whose announced chunk sizes pass :data:`~.body.MAX_BODY_BYTES` (``2**60``
  bytes in one chunk, say) answers 413 as soon as the size line arrives. The app sees only the
  bytes that came, so it would wait for the body timeout; and h11 refuses a size of more than
  20 hex digits with a bare 400 of its own.
- a header continued on a line that starts with a space or tab (obs-fold) answers 400. h11
  joins such a line to the header before (RFC 9112 section 5.2 allows that too), so the app
  saw ``application/json extra`` and answered 415; the RFC's other choice, a 400 that says
  why, is what a client that folds needs to hear.

Deadlines are loop timers, one per connection: a slow client costs a timer, never a stall of
the loop the daemon runs in.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, ClassVar

import h11
import structlog
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
from uvicorn.protocols.http.h11_impl import H11Protocol

from .body import MAX_BODY_BYTES
from .guard import REFUSED_STATE_KEY
from .raw import answer, head_timeout_answer

log = structlog.get_logger("worker.http")

#: Past the body deadline, the time the app has to send its own 408 before the connection goes.
BODY_GRACE_SECONDS = 1.0
#: Where a request head ends: h11's own blank-line pattern (it accepts a bare LF too).
_HEAD_END = re.compile(rb"\n\r?\n")
#: A line of a head that starts with a space or tab: an obs-fold continuation.
_OBS_FOLD = re.compile(rb"\n[ \t]")
_HEX_DIGITS = re.compile(rb"[0-9A-Fa-f]*")
#: More significant hex digits than this is past any body limit (16**8 is 4 GiB).
_MAX_SIZE_DIGITS = 8
#: A chunk size line longer than this (its extensions) is not followed: h11 judges it.
_MAX_SIZE_LINE = 4096


class Refusal(h11.RemoteProtocolError):
    """A request refused by this protocol, with the JSON answer it gets."""

    def __init__(self, status: int, error: str, *, head: bool = False, **details: Any) -> None:
        super().__init__(error, error_status_hint=status)
        self.status = status
        self.error = error
        #: Whether the request was a HEAD (its answer has no body).
        self.head = head
        self.details = details

    def answer(self) -> bytes:
        """The whole JSON answer as bytes (it closes its connection)."""
        body = json.dumps({"error": self.error, **self.details}, separators=(",", ":")).encode()
        return answer(self.status, "application/json", body, head_only=self.head)


def body_too_large(*, head: bool) -> Refusal:
    """The 413 of a body announced past the limit (the app's own words for it)."""
    return Refusal(413, "request body too large", head=head, limit_bytes=MAX_BODY_BYTES)


class ChunkBudget:
    """Adds up the chunk sizes one chunked body announces (RFC 9112 section 7.1), from its
    bytes as they arrive, so that a body announced past ``limit`` is known at its size line,
    not when its bytes (which may never come) would have.

    It follows the framing only as far as the sizes: at anything malformed it stops following
    and leaves the request to h11, which checks the framing itself. At the last chunk (size 0)
    it stops too: the trailer section is h11's.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.announced = 0
        self.following = True
        self._line = bytearray()
        #: Bytes of the current chunk's data still to pass over, then its CRLF.
        self._data_left = 0
        self._crlf_left = b""

    def over(self, data: bytes) -> bool:
        """Take the body's next bytes; whether what it announced so far passes the limit."""
        i, n = 0, len(data)
        while self.following and i < n:
            if self._data_left:
                step = min(self._data_left, n - i)
                self._data_left -= step
                i += step
                if not self._data_left:
                    self._crlf_left = b"\r\n"
                continue
            if self._crlf_left:
                seen = data[i : i + len(self._crlf_left)]
                if not self._crlf_left.startswith(seen):
                    self.following = False
                    break
                self._crlf_left = self._crlf_left[len(seen) :]
                i += len(seen)
                continue
            end = data.find(b"\n", i)
            self._line += data[i:] if end < 0 else data[i:end]
            if len(self._line) > _MAX_SIZE_LINE:
                self.following = False
                break
            digits = _HEX_DIGITS.match(self._line)
            size_so_far = digits.group() if digits else b""
            # The digits so far are a prefix of the size: if they pass the limit, so does it.
            if self._past_limit(size_so_far):
                return True
            if end < 0:
                break
            i = end + 1
            self._line.clear()
            significant = size_so_far.lstrip(b"0")
            if not significant:
                # No size at all (h11 refuses that) or the last chunk (the trailers are h11's).
                self.following = False
                break
            size = int(significant, 16)
            self.announced += size
            self._data_left = size
        return False

    def _past_limit(self, digits: bytes) -> bool:
        significant = digits.lstrip(b"0")
        if len(significant) > _MAX_SIZE_DIGITS:
            return True
        return self.announced + int(significant or b"0", 16) > self.limit


class ScreenedConnection(h11.Connection):
    """An :class:`h11.Connection` that refuses an obs-fold head and a chunked body announced
    past ``body_limit`` by raising :class:`Refusal` (an :class:`h11.RemoteProtocolError`, so
    uvicorn answers it through ``send_400_response``) and keeps it as :attr:`refusal`.

    Only h11's public surface is used: the events, ``their_state`` and ``trailing_data``
    (and, as uvicorn does, h11's default limit on a head's size).
    """

    def __init__(self, *args: Any, body_limit: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.body_limit = body_limit
        self.refusal: Refusal | None = None
        self._budget: ChunkBudget | None = None
        #: Whether the request whose body is read is a HEAD.
        self._head_request = False
        #: Whether a complete head may be waiting unchecked: only a newline can complete one,
        #: so the buffer is looked at once per head, not once per byte a slow client sends.
        self._head_due = True

    def screen(self, data: bytes) -> Refusal | None:
        """Look at bytes just received, before h11 does; the refusal they earn, if any."""
        if b"\n" in data:
            self._head_due = True
        if self._budget is not None and self._budget.over(data):
            self.refusal = body_too_large(head=self._head_request)
        return self.refusal

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        if self.refusal is not None:
            raise self.refusal
        if self.their_state is h11.IDLE and self._head_due:
            self._head_due = False
            self._check_head()
        event = super().next_event()
        if isinstance(event, h11.Request):
            self._head_due = True
            self._budget = None
            self._head_request = event.method == b"HEAD"
            chunked = (b"transfer-encoding", b"chunked") in event.headers
            if chunked and self.their_state is h11.SEND_BODY:
                self._budget = ChunkBudget(self.body_limit)
                # What came with the head: the rest arrives through screen().
                if self._budget.over(self.trailing_data[0]):
                    raise self._refuse(body_too_large(head=self._head_request))
        elif isinstance(event, h11.EndOfMessage):
            self._budget = None
        return event

    def _check_head(self) -> None:
        buffered = self.trailing_data[0]
        end = _HEAD_END.search(buffered)
        if end is not None and _OBS_FOLD.search(buffered, 0, end.end()):
            raise self._refuse(
                Refusal(
                    400,
                    "obsolete line folding in the request headers: send each header on one line"
                    " (RFC 9112 section 5.2)",
                )
            )

    def _refuse(self, refusal: Refusal) -> Refusal:
        self.refusal = refusal
        return refusal


class BoundedH11Protocol(H11Protocol):
    """:class:`H11Protocol` with a header and a body deadline and the refusals of a
    :class:`ScreenedConnection` (see the module docstring).

    Configure a subclass with :func:`bounded_protocol`; uvicorn builds one instance per
    connection from the class it is given.
    """

    header_timeout: ClassVar[float] = 10.0
    body_timeout: ClassVar[float] = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        max_size = self.config.h11_max_incomplete_event_size
        self.conn: ScreenedConnection = ScreenedConnection(
            h11.SERVER,
            max_size if max_size is not None else DEFAULT_MAX_INCOMPLETE_EVENT_SIZE,
            body_limit=MAX_BODY_BYTES,
        )
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._sync_timers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head()
        self._cancel_body()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        refusal = self.conn.screen(data)
        if refusal is not None:
            # Refused from these bytes on: h11 need not see them.
            self._answer_refusal(refusal)
            return
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        self._sync_timers()

    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to any h11.RemoteProtocolError; ours carry their own status and text.
        if self.conn.refusal is not None:
            self._answer_refusal(self.conn.refusal)
            return
        super().send_400_response(msg)

    def _answer_refusal(self, refusal: Refusal) -> None:
        """Answer ``refusal`` (unless a response already began) and close the connection."""
        if self.transport.is_closing():
            return
        log.info(
            "http.refused", status=refusal.status, reason=refusal.error, client=self._client_host()
        )
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # The app may be reading this body: its read ends as if the client had left, and
            # anything it sends from now on is dropped (the answer below is the one).
            cycle.scope.setdefault("state", {})[REFUSED_STATE_KEY] = refusal.status
            cycle.disconnected = True
            cycle.message_event.set()
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            # Written as bytes, not through h11's state machine: the connection closes at once.
            self.transport.write(refusal.answer())
        self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._sync_timers()

    def _sync_timers(self) -> None:
        """Arm the deadline of what the connection waits for: a head (IDLE) or the rest of a
        body (SEND_BODY); cancel the other. A deadline runs from when the wait began."""
        if self.transport is None or self.transport.is_closing():
            self._cancel_head()
            self._cancel_body()
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(self.header_timeout, self._head_expired)
        else:
            self._cancel_head()
        if state is h11.SEND_BODY:
            if self._body_timer is None:
                self._body_timer = self.loop.call_later(
                    self.body_timeout + BODY_GRACE_SECONDS, self._body_expired
                )
        else:
            self._cancel_body()

    def _head_expired(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        buffered, _ = self.conn.trailing_data
        if buffered:
            # Part of a head came: say why the connection ends. Nothing came: just close, as
            # an idle keep-alive connection is closed.
            self.transport.write(head_timeout_answer(self.header_timeout))
            log.info("http.header_timeout", client=self._client_host())
        self.transport.close()

    def _body_expired(self) -> None:
        self._body_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.SEND_BODY:
            return
        log.info("http.body_timeout", client=self._client_host())
        self.transport.close()

    def _cancel_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _cancel_body(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _client_host(self) -> str | None:
        return self.client[0] if self.client else None


def bounded_protocol(header_timeout: float, body_timeout: float) -> type[BoundedH11Protocol]:
    """A :class:`BoundedH11Protocol` class with these deadlines, for ``uvicorn.Config(http=)``."""
    return type(
        "BoundedH11Protocol",
        (BoundedH11Protocol,),
        {"header_timeout": header_timeout, "body_timeout": body_timeout},
    )
