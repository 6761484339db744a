"""The Starlette application of one process."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ..state import ServiceState
from .health import health_routes
from .ingest import ingest_routes


def create_app(state: ServiceState) -> Starlette:
    """Health routes on every role; /v1 only where the role serves ingest (else 404)."""
    routes: list[BaseRoute] = [*health_routes(state)]
    if state.settings.serves_ingest:
        routes.extend(ingest_routes(state))
    else:

        async def no_ingest(_: Request) -> Response:
            return JSONResponse({"error": "not found: this is a worker process"}, status_code=404)

        routes.append(
            Route("/v1/{rest:path}", no_ingest, methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
        )
    return Starlette(routes=routes)
