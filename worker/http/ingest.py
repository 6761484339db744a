"""/v1/*: usage-event ingest, jobs and timers (api and all roles)."""

from __future__ import annotations

from starlette.routing import BaseRoute

from ..state import ServiceState


def ingest_routes(state: ServiceState) -> list[BaseRoute]:
    """The /v1 routes (issue 4 fills them in)."""
    return []
