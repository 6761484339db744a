"""/metrics, /healthz and /readyz as Starlette routes (the api and all roles; a worker process
serves the same answers from :mod:`.probe_server`)."""

from __future__ import annotations

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..state import ServiceState
from . import probes


class MetricsEndpoint:
    """``GET /metrics`` as a raw ASGI app, so that a queue count slower than the scrape's
    budget can finish after the answer (it then sets the gauges for the next scrape)."""

    def __init__(self, state: ServiceState) -> None:
        self._metrics = probes.Metrics(state)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tg:
            body = await self._metrics.body(tg)
            response = Response(body, media_type=self._metrics.content_type)
            await response(scope, receive, send)


def health_routes(state: ServiceState) -> list[Route]:
    """The operational endpoints."""

    async def healthz(_: Request) -> Response:
        status, body = probes.healthz()
        return Response(body, status_code=status, media_type=probes.JSON)

    async def readyz(_: Request) -> Response:
        status, body = await probes.readyz(state)
        return Response(body, status_code=status, media_type=probes.JSON)

    return [
        Route("/metrics", MetricsEndpoint(state), methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]
