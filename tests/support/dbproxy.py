"""A TCP proxy in front of PostgreSQL that a test can cut: the database "goes down" for one
daemon without stopping the shared server; or it drops one connection just as the server has
answered (and committed) a chosen statement, so the client never hears that it did."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

T = TypeVar("T")

#: The untyped requests that may come before a startup message (SSL, GSS encryption).
_PRE_STARTUP = {80877103, 80877104}


def _ready_for_query(stream: bytes | bytearray) -> bool:
    """Whether these backend messages (from a message boundary) include a ReadyForQuery."""
    at = 0
    while at + 5 <= len(stream):
        if stream[at : at + 1] == b"Z":
            return True
        (length,) = struct.unpack("!i", stream[at + 1 : at + 5])
        at += 1 + length
    return False


@dataclass
class _Session:
    """What the proxy follows of one client's protocol stream (frontend messages only)."""

    #: The text of each prepared statement by name ("" is the unnamed one).
    statements: dict[bytes, bytes] = field(default_factory=dict)
    started: bool = False
    buffer: bytearray = field(default_factory=bytearray)
    #: A marked statement was bound while armed: its answer is to be dropped with the session.
    swallow: bool = False


class DatabaseProxy:
    """Forwards 127.0.0.1:port to the database of ``url``; :meth:`cut` drops every connection
    and refuses new ones until :meth:`restore`."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._url = parts
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._cut = False
        #: The statement text to lose the next answer of, and a value bound to it (see
        #: :meth:`lose_answer`).
        self._marker: bytes | None = None
        self._bound = b""
        self.lost_answers = 0
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.port = self._call(self._start())

    @property
    def url(self) -> str:
        """The database URL through the proxy."""
        user = f"{self._url.username}@" if self._url.username else ""
        netloc = f"{user}127.0.0.1:{self.port}"
        return urlunsplit((self._url.scheme, netloc, self._url.path, self._url.query, ""))

    def cut(self) -> None:
        """Close every proxied connection and refuse new ones."""
        self._call(self._set_cut(True))

    def restore(self) -> None:
        """Accept connections again."""
        self._call(self._set_cut(False))

    def lose_answer(self, marker: str, bound: str = "") -> None:
        """Arm: the next execution of a statement whose text contains ``marker`` (with
        ``bound`` among the bytes of its parameters, e.g. a queue name) reaches the
        server and runs to its end (ReadyForQuery: a statement outside a transaction block has
        committed by then), but its answer is never forwarded: both sides are aborted instead,
        as if the network failed at that instant. Once; :attr:`lost_answers` counts them."""
        self._call(self._arm(marker.encode(), bound.encode()))

    async def _arm(self, marker: bytes, bound: bytes) -> None:
        self._marker, self._bound = marker, bound

    def close(self) -> None:
        """Stop the proxy."""
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    async def _start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _set_cut(self, value: bool) -> None:
        self._cut = value
        if value:
            for writer in list(self._writers):
                writer.transport.abort()
            self._writers.clear()

    async def _close(self) -> None:
        await self._set_cut(True)
        if self._server is not None:
            self._server.close()
        # The loop is the proxy's own: let its piping tasks end (the cut above aborted their
        # sockets) before it stops, or they are reported as destroyed while pending. Cancelling
        # them instead makes asyncio's stream callback log each as an error.
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        session = _Session()
        await asyncio.gather(
            self._pipe(reader, up_writer, lambda data: self._frontend(session, data)),
            self._answers(up_reader, writer, up_writer, session),
        )

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        follow: Callable[[bytes], None] | None = None,
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                if follow is not None:
                    follow(data)
                writer.write(data)
                await writer.drain()
        writer.transport.abort()
        self._writers.discard(writer)

    async def _answers(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream: asyncio.StreamWriter,
        session: _Session,
    ) -> None:
        """Server to client; once ``session.swallow`` is set (by the client's Bind, before the
        server can answer it), what arrives is read and dropped up to ReadyForQuery, then both
        sides are aborted. The client waits for ReadyForQuery before its next statement, so the
        first byte that arrives after the Bind starts a message."""
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            dropped = bytearray()
            while data := await reader.read(65536):
                if not session.swallow:
                    writer.write(data)
                    await writer.drain()
                    continue
                dropped.extend(data)
                if _ready_for_query(dropped):
                    self.lost_answers += 1
                    break
        writer.transport.abort()
        upstream.transport.abort()
        self._writers.discard(writer)
        self._writers.discard(upstream)

    def _frontend(self, session: _Session, data: bytes) -> None:
        """Follow the client's messages: the text of each prepared statement, and whether one
        holding the marker is bound while armed (its Bind, Execute and Sync travel together)."""
        buffer = session.buffer
        buffer.extend(data)
        while True:
            if not session.started:  # untyped: length, then a request code or startup body
                if len(buffer) < 8:
                    return
                (length,) = struct.unpack("!i", buffer[:4])
                if len(buffer) < length:
                    return
                (code,) = struct.unpack("!i", buffer[4:8])
                session.started = code not in _PRE_STARTUP
                del buffer[:length]
                continue
            if len(buffer) < 5:
                return
            kind = bytes(buffer[:1])
            (length,) = struct.unpack("!i", buffer[1:5])
            if len(buffer) < 1 + length:
                return
            body = bytes(buffer[5 : 1 + length])
            del buffer[: 1 + length]
            if kind == b"P":  # Parse: name, text
                name, _, rest = body.partition(b"\0")
                session.statements[name] = rest.partition(b"\0")[0]
            elif kind == b"B" and self._marker is not None:  # Bind: portal, statement
                statement = body.split(b"\0", 2)[1]
                text = session.statements.get(statement, b"")
                if self._marker in text and self._bound in body:
                    self._marker = None
                    session.swallow = True
