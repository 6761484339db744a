"""The Starlette application of one process."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from ..state import ServiceState
from .guard import ClientGone
from .health import health_routes
from .ingest import ingest_routes


def create_app(state: ServiceState) -> Starlette:
    """Health routes on every role; /v1, /v1/admin and /console only where the role serves
    ingest (else 404)."""
    routes: list[BaseRoute] = [*health_routes(state)]
    if state.settings.serves_ingest:
        # Imported here: a worker process serves no console, and need not load Jinja2.
        from .admin.api import admin_api_routes
        from .admin.auth import Tokens
        from .admin.console import console_routes
        from .admin.gate import AdminGate

        tokens = Tokens(state.settings.admin_token, state.settings.console_view_token)
        # /v1/admin first: it is not behind the ingest token, and Mount("/v1") would match it.
        routes.append(
            Mount(
                "/v1/admin",
                routes=admin_api_routes(state),
                middleware=[
                    Middleware(ClientGone),
                    Middleware(AdminGate, tokens=tokens, scheme="bearer"),
                ],
            )
        )
        routes.append(
            Mount(
                "/console",
                routes=console_routes(state),
                middleware=[
                    Middleware(ClientGone),
                    Middleware(AdminGate, tokens=tokens, scheme="basic"),
                ],
            )
        )
        routes.extend(ingest_routes(state))
    else:

        async def no_ingest(_: Request) -> Response:
            return JSONResponse({"error": "not found: this is a worker process"}, status_code=404)

        routes.append(
            Route("/v1/{rest:path}", no_ingest, methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
        )
    return Starlette(routes=routes)
