"""uvicorn in the daemon's own event loop, without its signal handling (ours stops it), with
deadlines for slow request heads and bodies (:mod:`.protocol`)."""

from __future__ import annotations

import contextlib
from collections.abc import Generator

import anyio
import structlog
import uvicorn
from anyio.abc import TaskStatus
from starlette.applications import Starlette

from .protocol import bounded_protocol

log = structlog.get_logger("worker.http")


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # The daemon's signal module owns SIGTERM/SIGINT; uvicorn must not swallow them.
        yield


class HttpServer:
    """Serves ``app`` on host:port until :meth:`stop`; a request head must arrive within
    ``header_timeout`` seconds and its body within ``body_timeout`` more."""

    def __init__(
        self,
        app: Starlette,
        host: str,
        port: int,
        *,
        header_timeout: float = 10.0,
        body_timeout: float = 30.0,
    ) -> None:
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            # h11 with deadlines, whatever "auto" would pick (httptools has none either).
            http=bounded_protocol(header_timeout, body_timeout),
            log_config=None,
            access_log=False,
            lifespan="off",
            server_header=False,
            timeout_graceful_shutdown=5,
        )
        self._server = _Server(config)
        self.port = port

    async def run(self, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start listening, report the bound port, serve until stopped."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._server.serve)
            while not self._server.started:
                if self._server.should_exit:
                    raise OSError(f"HTTP server could not listen on port {self.port}")
                await anyio.sleep(0.01)
            sockets = [s for server in self._server.servers for s in server.sockets]
            if sockets:
                self.port = sockets[0].getsockname()[1]
            log.info("http.listening", host=self._server.config.host, port=self.port)
            task_status.started(self.port)

    def stop(self) -> None:
        """Ask the server to finish."""
        self._server.should_exit = True
