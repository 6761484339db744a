"""A worker process's HTTP: /healthz, /readyz and /metrics (and a 404 for /v1), served on
anyio's TCP listener without an ASGI stack.

A worker serves nothing else, and Starlette with uvicorn (and click and multiprocessing, which
uvicorn imports) cost its process about 3.8 MB of its 54.5 MB peak. The api and all roles keep
Starlette (:mod:`.server`). Every request is answered and its connection closed: no keep-alive,
no body read. A head has ``header_timeout`` seconds and ``MAX_HEAD_BYTES`` to arrive, else a
408 (part of it came), a close (nothing came) or a 431; an answer has SEND_TIMEOUT_SECONDS to
leave.
"""

from __future__ import annotations

import anyio
import structlog
from anyio.abc import SocketAttribute, SocketStream, TaskGroup, TaskStatus
from anyio.streams.buffered import BufferedByteReceiveStream

from ..state import ServiceState
from . import probes
from .raw import answer, head_timeout_answer

log = structlog.get_logger("worker.http")

#: The request line and headers together; a scraper or a health check sends a few hundred.
MAX_HEAD_BYTES = 16_384
#: How long an answer may take to leave (a /metrics text is about 12 KB: one socket buffer).
SEND_TIMEOUT_SECONDS = 30.0
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

                async def handle(stream: SocketStream) -> None:
                    await self._handle(stream, tg)

                await listener.serve(handle, tg)

    def stop(self) -> None:
        """Stop listening; requests in flight end with it."""
        self._stopped = True
        if self._scope is not None:
            self._scope.cancel()

    async def _handle(self, stream: SocketStream, tg: TaskGroup) -> None:
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
        try:
            with anyio.fail_after(self._header_timeout):
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
