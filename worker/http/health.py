"""/metrics, /healthz and /readyz: on every role."""

from __future__ import annotations

import anyio
import structlog
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..gauges import SCRAPE_WAIT_SECONDS, QueueGauges
from ..metrics import READY
from ..state import ServiceState

log = structlog.get_logger("worker.metrics")


class MetricsEndpoint:
    """``GET /metrics`` as a raw ASGI app, so that a queue count slower than the scrape's
    budget can finish after the answer (it then sets the gauges for the next scrape)."""

    def __init__(self, state: ServiceState) -> None:
        self._state = state
        self._gauges = QueueGauges(state.settings.jobs_schema)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tg:
            deadline = anyio.current_time() + SCRAPE_WAIT_SECONDS
            counted = self._gauges.start_refresh(self._state.pool, tg)
            # Scrapes keep worker_ready current: nothing else polls /readyz in a compose stack.
            # Checked while the count runs.
            READY.set(0 if await self._state.readiness() else 1)
            with anyio.move_on_at(deadline) as budget:
                await counted.wait()
            if budget.cancelled_caught:
                log.info("metrics.count_pending", waited=SCRAPE_WAIT_SECONDS)
            response = Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
            await response(scope, receive, send)


def health_routes(state: ServiceState) -> list[Route]:
    """The operational endpoints."""

    async def healthz(_: Request) -> Response:
        return JSONResponse({"ok": True})

    async def readyz(_: Request) -> Response:
        reason = await state.readiness()
        READY.set(0 if reason else 1)
        if reason is None:
            return JSONResponse({"ready": True})
        return JSONResponse({"ready": False, "reason": reason}, status_code=503)

    return [
        Route("/metrics", MetricsEndpoint(state), methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]
