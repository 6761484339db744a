"""A TCP proxy in front of PostgreSQL that a test can cut: the database "goes down" for one
daemon without stopping the shared server."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

T = TypeVar("T")


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
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.transport.abort()
        self._writers.discard(writer)
