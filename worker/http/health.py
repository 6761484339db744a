"""/metrics, /healthz and /readyz: on every role."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..gauges import QueueGauges
from ..metrics import READY
from ..state import ServiceState


def health_routes(state: ServiceState) -> list[Route]:
    """The operational endpoints."""
    gauges = QueueGauges(state.settings.jobs_schema)

    async def metrics(_: Request) -> Response:
        # Scrapes keep worker_ready current: nothing else polls /readyz in a compose stack.
        READY.set(0 if await state.readiness() else 1)
        await gauges.refresh(state.pool)
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    async def healthz(_: Request) -> Response:
        return JSONResponse({"ok": True})

    async def readyz(_: Request) -> Response:
        reason = await state.readiness()
        READY.set(0 if reason else 1)
        if reason is None:
            return JSONResponse({"ready": True})
        return JSONResponse({"ready": False, "reason": reason}, status_code=503)

    return [
        Route("/metrics", metrics, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]
