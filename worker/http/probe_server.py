"""A worker process's HTTP: /healthz, /readyz and /metrics (and a 404 for /v1), served on
anyio's TCP listener without an ASGI stack.

A worker serves nothing else, and Starlette with uvicorn (and click and multiprocessing, which
uvicorn imports) cost its process about 3.8 MB of its 54.5 MB peak. The api and all roles keep
Starlette (:mod:`.server`). Every request is answered and its connection closed: no keep-alive,
no body read. A head has ``header_timeout`` seconds and ``MAX_HEAD_BYTES`` to arrive, else a
408 (part of it came), a close (nothing came) or a 431; an answer has SEND_TIMEOUT_SECONDS to
leave.

Nothing a client does ends the listener. At most ``MAX_CONNECTIONS`` connections are open at
once: one more closes the one that has waited longest for its head (a scraper or a health check
sends its head at once, so only an idle or slow client is ever closed). When the process runs
out of file descriptors anyway (the pool, the hub client and the probes share them), a failed
``accept()`` is logged once, waited out for ``ACCEPT_BACKOFF_SECONDS`` and tried again, while
the connection waits in the kernel's backlog.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import structlog
from anyio.abc import SocketAttribute, SocketListener, SocketStream, TaskGroup, TaskStatus
from anyio.streams.buffered import BufferedByteReceiveStream

from ..state import ServiceState
from . import probes
from .raw import answer, head_timeout_answer

log = structlog.get_logger("worker.http")

#: The request line and headers together; a scraper or a health check sends a few hundred.
MAX_HEAD_BYTES = 16_384
#: How long an answer may take to leave (a /metrics text is about 12 KB: one socket buffer).
SEND_TIMEOUT_SECONDS = 30.0
#: Connections open at once; far under any descriptor limit a process runs with (1,024 by
#: default), and far over what a scraper and a few health checks use.
MAX_CONNECTIONS = 64
#: How long the listener waits after an ``accept()`` the process's descriptors failed.
ACCEPT_BACKOFF_SECONDS = 0.1
#: Methods the three probes take (Starlette adds HEAD to a GET route too).
READ_METHODS = frozenset({"GET", "HEAD"})
_TEXT = "text/plain; charset=utf-8"
_V1_NOT_FOUND = probes.json_body({"error": "not found: this is a worker process"})
_HEAD_TOO_LARGE = answer(
    431, probes.JSON, probes.json_body({"error": f"request head over {MAX_HEAD_BYTES} bytes"})
)


class ProbeServer:
    """Serves the probes of ``state`` on host:port until :meth:`stop` (same surface as
    :class:`~worker.http.server.HttpServer`)."""

    def __init__(
        self, state: ServiceState, host: str, port: int, *, header_timeout: float = 10.0
    ) -> None:
        self._state = state
        self._host = host
        self.port = port
        self._header_timeout = header_timeout
        self._metrics = probes.Metrics(state)
        self._scope: anyio.CancelScope | None = None
        self._stopped = False
        #: Connections open now; those still waiting for their head, oldest first, by scope.
        self._open = 0
        self._waiting: dict[anyio.CancelScope, None] = {}
        #: Whether the last accept() failed (its episode is logged once).
        self._accept_failing = False

    async def run(self, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen, report the bound port, serve until stopped."""
        with anyio.CancelScope() as self._scope:
            if self._stopped:
                return
            try:
                listener = await anyio.create_tcp_listener(
                    local_host=self._host, local_port=self.port, reuse_port=False
                )
            except OSError as exc:
                raise OSError(f"HTTP server could not listen on port {self.port}: {exc}") from exc
            async with listener, anyio.create_task_group() as tg:
                # anyio's typed attributes (ruff takes .extra for Django's).
                self.port = listener.extra(SocketAttribute.local_port)  # noqa: S610
                log.info("http.listening", host=self._host, port=self.port)
                task_status.started(self.port)

                for each in listener.listeners:
                    assert isinstance(each, SocketListener)
                    tg.start_soon(self._accept, each, tg)

    def stop(self) -> None:
        """Stop listening; requests in flight end with it."""
        self._stopped = True
        if self._scope is not None:
            self._scope.cancel()

    async def _accept(self, listener: SocketListener, tg: TaskGroup) -> None:
        """Accept connections until cancelled; an error of ``accept()`` (descriptors ran out,
        a connection reset before it was taken) never ends the loop."""
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if not self._accept_failing:
                    self._accept_failing = True
                    log.warning(
                        "http.accept_failed",
                        error=f"{type(exc).__name__}: {exc}",
                        retry_in=ACCEPT_BACKOFF_SECONDS,
                        hint="the process is out of file descriptors; raise its limit",
                    )
                await anyio.sleep(ACCEPT_BACKOFF_SECONDS)
                continue
            if self._accept_failing:
                self._accept_failing = False
                log.info("http.accept_recovered")
            if self._open >= MAX_CONNECTIONS and not self._close_longest_waiting():
                await stream.aclose()  # every connection is mid-answer: no room for this one
                continue
            self._open += 1
            tg.start_soon(self._handle, stream, tg)

    def _close_longest_waiting(self) -> bool:
        """Close the connection that has waited longest for its head; whether there was one."""
        for scope in self._waiting:
            del self._waiting[scope]
            scope.cancel()
            return True
        return False

    @contextmanager
    def _awaiting_head(self) -> Iterator[None]:
        """While the head is read, the connection may be closed to make room for a new one."""
        with anyio.CancelScope() as scope:
            self._waiting[scope] = None
            try:
                yield
            finally:
                self._waiting.pop(scope, None)

    async def _handle(self, stream: SocketStream, tg: TaskGroup) -> None:
        try:
            await self._serve(stream, tg)
        finally:
            self._open -= 1

    async def _serve(self, stream: SocketStream, tg: TaskGroup) -> None:
        async with stream:
            try:
                reply = await self._answer(stream, tg)
                # A client that never reads cannot hold the connection past this either.
                with anyio.move_on_after(SEND_TIMEOUT_SECONDS):
                    if reply:
                        await stream.send(reply)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass  # the client went away
            except Exception as exc:  # a bug here must not end the listener
                log.error("http.probe_failed", error=f"{type(exc).__name__}: {exc}", exc_info=exc)

    async def _answer(self, stream: SocketStream, tg: TaskGroup) -> bytes:
        buffered = BufferedByteReceiveStream(stream)
        head = b""
        try:
            with self._awaiting_head(), anyio.fail_after(self._header_timeout):
                head = await buffered.receive_until(b"\r\n\r\n", MAX_HEAD_BYTES)
        except TimeoutError:
            if buffered.buffer:
                peer = stream.extra(SocketAttribute.remote_address, None)  # noqa: S610
                client = peer[0] if isinstance(peer, tuple) else None
                log.info("http.header_timeout", client=client)
                return head_timeout_answer(self._header_timeout)
            return b""
        except anyio.DelimiterNotFound:
            return _HEAD_TOO_LARGE
        except (anyio.EndOfStream, anyio.IncompleteRead):
            return b""
        if not head:  # closed to make room for a newer connection
            return b""
        if len(head) > MAX_HEAD_BYTES:  # it came whole in one read past the bound
            return _HEAD_TOO_LARGE
        return await self._route(head.split(b"\r\n", 1)[0], tg)

    async def _route(self, request_line: bytes, tg: TaskGroup) -> bytes:
        parts = request_line.split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1.") or not parts[1]:
            return answer(400, _TEXT, b"Bad Request")
        method = parts[0].decode("ascii", "replace")
        path = parts[1].split(b"?", 1)[0]
        head_only = method == "HEAD"
        if path == b"/v1" or path.startswith(b"/v1/"):
            return answer(404, probes.JSON, _V1_NOT_FOUND, head_only=head_only)
        if path not in (b"/healthz", b"/readyz", b"/metrics"):
            return answer(404, _TEXT, b"Not Found", head_only=head_only)
        if method not in READ_METHODS:
            return answer(405, _TEXT, b"Method Not Allowed", extra=(("allow", "GET, HEAD"),))
        if path == b"/metrics":
            text = await self._metrics.body(tg)
            return answer(200, self._metrics.content_type, text, head_only=head_only)
        status, body = probes.healthz() if path == b"/healthz" else await probes.readyz(self._state)
        return answer(status, probes.JSON, body, head_only=head_only)
