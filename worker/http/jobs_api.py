"""``POST /v1/jobs/{queue}``, ``POST /v1/timers/{queue}``, ``DELETE /v1/timers/{queue}/{key}``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import unquote

import structlog
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from api_sender import USAGE_HELD_QUEUE, USAGE_QUEUE, QueueNotFound, Sender
from api_sender.events import parse_timestamp
from api_sender.options import MAX_START_AFTER_SECONDS
from api_sender.storable import segment

from ..state import ServiceState
from .body import read_json
from .guard import HttpError, field_errors, in_database

log = structlog.get_logger("worker.ingest")

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class JobRequest(BaseModel):
    """The body of ``POST /v1/jobs/{queue}``."""

    model_config = ConfigDict(extra="forbid")

    data: dict[str, Any]
    # strict: a number, not "5" or true; at most 100 years (api_sender's limit).
    start_after_seconds: float | None = Field(
        None, ge=0, le=MAX_START_AFTER_SECONDS, allow_inf_nan=False, strict=True
    )
    singleton_key: str | None = Field(None, min_length=1, max_length=500)
    priority: StrictInt = Field(0, ge=-(2**31), lt=2**31)


class TimerRequest(BaseModel):
    """The body of ``POST /v1/timers/{queue}``: exactly one of ``at`` and ``delay_seconds``."""

    model_config = ConfigDict(extra="forbid")

    at: datetime | None = None
    delay_seconds: float | None = Field(
        None, ge=0, le=MAX_START_AFTER_SECONDS, allow_inf_nan=False, strict=True
    )
    data: dict[str, Any] | None = None
    key: str | None = Field(None, min_length=1, max_length=500)

    @field_validator("at", mode="before")
    @classmethod
    def _at_is_rfc3339(cls, value: Any) -> Any:
        return None if value is None else parse_timestamp(value, "at")

    @model_validator(mode="after")
    def _one_instant(self) -> TimerRequest:
        if (self.at is None) == (self.delay_seconds is None):
            raise ValueError("give exactly one of at and delay_seconds")
        return self


def jobs_routes(state: ServiceState) -> list[BaseRoute]:
    """The job and timer routes (mounted under /v1 behind the token check)."""
    body_timeout = state.settings.http_body_timeout_seconds

    async def post_job(request: Request) -> Response:
        queue = request.path_params["queue"]
        try:
            _check_queue(queue)
            body = _validated(JobRequest, await read_json(request, timeout=body_timeout))

            async def send(sender: Sender) -> int | None:
                return await sender.send(
                    queue,
                    body.data,
                    start_after=body.start_after_seconds,
                    singleton_key=body.singleton_key,
                    priority=body.priority,
                )

            job_id = await _queued(state, queue, send)
        except HttpError as exc:
            return _rejected(exc, queue)
        if job_id is None:
            return _rejected(
                HttpError(409, "the queue's policy already holds a job with that key", id=None),
                queue,
            )
        return JSONResponse({"id": job_id}, status_code=202)

    async def post_timer(request: Request) -> Response:
        queue = request.path_params["queue"]
        try:
            _check_queue(queue)
            body = _validated(TimerRequest, await read_json(request, timeout=body_timeout))

            async def schedule(sender: Sender) -> int:
                return await sender.timers.schedule(
                    queue,
                    at=body.at,
                    delay_seconds=body.delay_seconds,
                    data=body.data,
                    key=body.key,
                )

            job_id = await _queued(state, queue, schedule)
        except HttpError as exc:
            return _rejected(exc, queue)
        return JSONResponse({"id": job_id}, status_code=202)

    async def delete_timer(request: Request) -> Response:
        queue, key = timer_target(request)

        async def cancel(sender: Sender) -> bool:
            return await sender.timers.cancel(queue, key)

        try:
            cancelled = await in_database(state, cancel)
        except HttpError as exc:
            return _rejected(exc, queue)
        if not cancelled:
            return JSONResponse({"error": "no pending timer with that key"}, status_code=404)
        return Response(status_code=204)

    # {queue:path}: a queue's name may hold a slash (the name rule allows one), sent as is or
    # as %2F. Deleting a timer names a queue and a key, which may both hold one: there the
    # queue's slashes come encoded (see timer_target).
    return [
        Route("/jobs/{queue:path}", post_job, methods=["POST"]),
        Route("/timers/{queue:path}", post_timer, methods=["POST"]),
        Route("/timers/{queue:path}/{key:path}", delete_timer, methods=["DELETE"]),
    ]


def timer_target(request: Request) -> tuple[str, str]:
    """The queue and key of ``DELETE /v1/timers/{queue}/{key}``: the first path segment after
    /v1/timers is the queue, everything after it the key, split where the client put a slash
    (so a slash in the queue's name is sent as %2F; one in the key may be either).

    The decoded path has lost that distinction, so the raw one is split. Should the raw path
    not spell /v1/timers/ plainly (its own letters percent-encoded), the decoded one is split
    at its first slash instead.
    """
    raw: bytes = request.scope.get("raw_path") or b""
    segments = [
        unquote(part.decode("ascii", "replace"), errors="replace") for part in raw.split(b"/")
    ]
    if len(segments) >= 5 and segments[:3] == ["", "v1", "timers"]:
        return segments[3], "/".join(segments[4:])
    queue, key = request.path_params["queue"], request.path_params["key"]
    first, _, rest = f"{queue}/{key}".partition("/")
    return first, rest


def _check_queue(queue: str) -> None:
    # A raw job on a usage queue would skip the event validation ingest does; a malformed event
    # there could only ever be held, never delivered.
    if queue in (USAGE_QUEUE, USAGE_HELD_QUEUE):
        raise HttpError(400, "usage events go through POST /v1/usage-events")


def _validated(model: type[M], body: Any) -> M:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise HttpError(400, "invalid request", errors=field_errors(exc, "(body)")) from None


async def _queued(state: ServiceState, queue: str, work: Callable[[Sender], Awaitable[T]]) -> T:
    try:
        result = await in_database(state, work)
    except QueueNotFound:
        raise HttpError(404, f"queue {segment(queue)!r} is not installed") from None
    return result


def _rejected(exc: HttpError, queue: str) -> Response:
    log.info("ingest.rejected", status=exc.status, reason=exc.error, queue=segment(queue))
    return exc.response()
