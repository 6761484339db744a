"""uvicorn's h11 protocol with the two deadlines it lacks: for the request head and the body.

uvicorn bounds only the idle time between requests (``timeout_keep_alive``). A client that
opens a connection and sends nothing, dribbles its headers, or announces a body (or a 2**60-byte
chunk) it never sends would hold its connection for ever. Here every connection waiting for a
request head has ``header_timeout`` seconds to complete it (then a 408 if part of a head came,
else a close), and every request body must be in within ``body_timeout`` seconds of its head.
The app answers a late /v1 body with a JSON 408 itself (``worker/http/body.py``); this
protocol's body deadline, a moment later, is the backstop for everything else: a body nobody
reads (an early 401/413, /metrics with a body) is not waited on longer than that either.

Deadlines are loop timers, one per connection: a slow client costs a timer, never a stall of
the loop the daemon runs in.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import h11
import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

from .raw import head_timeout_answer

log = structlog.get_logger("worker.http")

#: Past the body deadline, the time the app has to send its own 408 before the connection goes.
BODY_GRACE_SECONDS = 1.0


class BoundedH11Protocol(H11Protocol):
    """:class:`H11Protocol` with a header and a body deadline (see the module docstring).

    Configure a subclass with :func:`bounded_protocol`; uvicorn builds one instance per
    connection from the class it is given.
    """

    header_timeout: ClassVar[float] = 10.0
    body_timeout: ClassVar[float] = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._sync_timers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head()
        self._cancel_body()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        self._sync_timers()

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
