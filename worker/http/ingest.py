"""/v1/*: usage-event ingest, jobs and timers (api and all roles).

``POST /v1/usage-events`` takes one event or ``{"events": [...]}`` (1-1000) and enqueues them
all in one statement, or none: any invalid event answers 400 with field-level errors. Unlike
the Python API, HTTP requires ``occurred_at`` (contract section 4): a client's own clock says
when usage happened, not the time its request got through.
"""

from __future__ import annotations

from typing import Any

import structlog
from pydantic import ValidationError
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from api_sender import QueueNotFound, Sender, UsageEvent
from api_sender.storable import segment

from ..state import ServiceState
from .body import read_json
from .guard import ClientGone, HttpError, IngestAuth, field_errors, in_database
from .jobs_api import jobs_routes

log = structlog.get_logger("worker.ingest")

#: The most events one request may carry.
MAX_EVENTS = 1000
#: Field errors listed in a 400 answer (the count says how many there were in all).
MAX_ERRORS_SHOWN = 100

# UsageEvent builds its validator on first use (a worker process never validates one); the
# roles that ingest build it now, not in their first request.
UsageEvent.model_rebuild()


def ingest_routes(state: ServiceState) -> list[BaseRoute]:
    """The /v1 routes behind the bearer-token check."""
    body_timeout = state.settings.http_body_timeout_seconds

    async def usage_events(request: Request) -> Response:
        try:
            events = parse_events(await read_json(request, timeout=body_timeout))

            async def enqueue(sender: Sender) -> list[int]:
                return await sender.usage.enqueue(events)

            try:
                await in_database(state, enqueue)
            except QueueNotFound:
                raise HttpError(
                    503, "usage queue not installed: a worker install creates it"
                ) from None
        except HttpError as exc:
            log.info(
                "ingest.rejected",
                status=exc.status,
                reason=exc.error,
                errors=exc.details.get("errors", [])[:5],
            )
            return exc.response()
        ids = [event.id for event in events]
        log.debug("ingest.accepted", count=len(ids), ids=ids)
        return JSONResponse({"accepted": len(ids), "ids": ids}, status_code=202)

    routes: list[BaseRoute] = [
        Route("/usage-events", usage_events, methods=["POST"]),
        *jobs_routes(state),
    ]
    return [
        Mount(
            "/v1",
            routes=routes,
            middleware=[
                Middleware(ClientGone),
                Middleware(IngestAuth, token=state.settings.ingest_token),
            ],
        )
    ]


def parse_events(body: Any) -> list[UsageEvent]:
    """The events of a request body, or :class:`HttpError` 400 listing every invalid field."""
    if isinstance(body, dict) and "events" in body:
        unknown = sorted(set(body) - {"events"})
        if unknown:
            raise HttpError(
                400,
                "invalid request",
                errors=[_error(None, segment(k), "unknown field") for k in unknown[:10]],
            )
        items = body["events"]
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_EVENTS:
            raise HttpError(
                400,
                "invalid request",
                errors=[_error(None, "events", f"must be a list of 1 to {MAX_EVENTS} events")],
            )
    elif isinstance(body, dict):
        items = [body]
    else:
        raise HttpError(400, 'the body must be one event or {"events": [...]}')
    events: list[UsageEvent] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for index, item in enumerate(items):
        if isinstance(item, dict) and item.get("occurred_at") is None:
            errors.append(
                _error(index, "occurred_at", "required: an RFC 3339 timestamp with an offset")
            )
        try:
            event = UsageEvent.model_validate(item)
        except ValidationError as exc:
            errors.extend(field_errors(exc, "(event)", index))
            continue
        if event.id in seen:
            errors.append(_error(index, "id", "the same id appears twice in this request"))
        seen.add(event.id)
        events.append(event)
    if errors:
        raise HttpError(
            400,
            "invalid usage events: nothing was enqueued",
            errors=errors[:MAX_ERRORS_SHOWN],
            error_count=len(errors),
        )
    return events


def _error(index: int | None, field: str, message: str) -> dict[str, Any]:
    error: dict[str, Any] = {"field": field, "message": message}
    if index is not None:
        error["index"] = index
    return error
