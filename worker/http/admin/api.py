"""``/v1/admin/*``: the admin JSON API over ``sender.jobs`` and ``sender.queues`` (section 10).

Every action is recorded with ``actor_via = 'api'`` and the principal (``admin``). Job data is
redacted to its size unless ``ADMIN_SHOW_DATA`` is on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from api_sender import (
    Actor,
    InvalidArgument,
    JobFilter,
    PermissionDenied,
    QueueNotFound,
    Sender,
)
from api_sender.events import parse_timestamp
from api_sender.jobs import ACTION_STATES, MAX_PAGE, Action, KeyContention
from api_sender.storable import segment

from ...state import ServiceState
from ..body import read_json
from ..guard import HttpError, in_database
from ..inputs import JOB_ID_RULE, QUEUE_NAME_RULE, ascii_int, is_queue_name
from ..inputs import job_id as job_id_of
from .views import queues_document

log = structlog.get_logger("worker.admin")

T = TypeVar("T")

JOB_ACTIONS: tuple[Action, ...] = tuple(ACTION_STATES)
QUEUE_ACTIONS = ("pause", "resume", "purge")
_FILTER_KEYS = {"queue", "state", "since", "until"}


def admin_api_routes(state: ServiceState) -> list[BaseRoute]:
    """The routes mounted under /v1/admin (behind :class:`~.gate.AdminGate`)."""
    show_data = state.settings.admin_show_data
    body_timeout = state.settings.http_body_timeout_seconds

    async def queues(_: Request) -> Response:
        async def read(sender: Sender) -> list[dict[str, Any]]:
            return await queues_document(sender.pool, sender.schema)

        return await _answer(state, read, lambda doc: {"queues": doc})

    async def list_jobs(request: Request) -> Response:
        params = request.query_params
        unknown = sorted(set(params) - {"queue", "state", "key", "limit", "after"})
        if unknown:
            return HttpError(400, f"unknown query parameter(s): {', '.join(unknown)}").response()
        limit = ascii_int(params.get("limit", "100"), max_digits=len(str(MAX_PAGE)))
        if limit is None:
            return HttpError(400, f"limit: not an integer from 1 to {MAX_PAGE}").response()
        after = params.get("after") or None
        if after is not None and job_id_of(after) is None:
            return HttpError(400, "after: not a cursor (the next of a previous page)").response()

        async def read(sender: Sender) -> Any:
            return await sender.jobs.list(
                queue=params.get("queue") or None,
                state=params.get("state") or None,  # type: ignore[arg-type]
                key=params.get("key") or None,
                limit=limit,
                after=after,
            )

        return await _answer(
            state,
            read,
            lambda page: {
                "jobs": [job.as_json(show_data=show_data) for job in page.jobs],
                "next": page.next,
            },
        )

    async def get_job(request: Request) -> Response:
        job_id = job_id_of(request.path_params["id"])
        if job_id is None:
            return HttpError(404, f"no such job: {JOB_ID_RULE}").response()

        async def read(sender: Sender) -> Any:
            return await sender.jobs.get(job_id)

        return await _answer(state, read, lambda job: job)

    async def job_action(request: Request) -> Response:
        action = request.path_params["action"]
        if action not in JOB_ACTIONS:
            return HttpError(404, f"unknown job action {segment(action)!r}").response()
        actor = Actor("api", request.state.principal)
        try:
            body = await read_json(request, timeout=body_timeout)
            target = _job_target(body)
        except HttpError as exc:
            return exc.response()

        async def act(sender: Sender) -> dict[str, Any]:
            jobs = sender.jobs.as_actor(actor)
            if isinstance(target, JobFilter):
                dry_run = body.get("dry_run", True)
                result = await jobs.act_where(action, target, dry_run=dry_run)
                return {
                    "changed": result.changed,
                    "ids": result.ids,
                    "skipped": result.skipped,
                    "dry_run": dry_run,
                }
            result = await jobs.act(action, target)
            # skipped: left alone to keep a key's promise (resume and retry; 0 otherwise).
            return {"changed": result.changed, "ids": result.ids, "skipped": result.skipped}

        return await _answer(state, act, lambda doc: doc, action=f"job.{action}")

    async def queue_action(request: Request) -> Response:
        # {queue:path}: a queue's name may hold a slash (sent as is or as %2F, the same once
        # decoded); the action is the last segment.
        queue, action = request.path_params["queue"], request.path_params["action"]
        if action not in QUEUE_ACTIONS:
            return HttpError(404, f"unknown queue action {segment(action)!r}").response()
        if not is_queue_name(queue):
            return HttpError(400, f"queue: not a queue name ({QUEUE_NAME_RULE})").response()
        actor = Actor("api", request.state.principal)

        async def act(sender: Sender) -> dict[str, Any]:
            api = sender.queues.as_actor(actor)
            if action == "purge":
                return {"queue": queue, "deleted": await api.purge(queue)}
            changed = await (api.pause(queue) if action == "pause" else api.resume(queue))
            return {"queue": queue, "paused": action == "pause", "changed": changed}

        return await _answer(state, act, lambda doc: doc, action=f"queue.{action}")

    return [
        Route("/queues", queues, methods=["GET"]),
        Route("/jobs", list_jobs, methods=["GET"]),
        Route("/jobs/{id}", get_job, methods=["GET"]),
        Route("/jobs/{action}", job_action, methods=["POST"]),
        Route("/queues/{queue:path}/{action}", queue_action, methods=["POST"]),
    ]


def _job_target(body: Any) -> list[int] | JobFilter:
    """``{"ids": [...]}`` or ``{"filter": {...}, "dry_run": bool}``, checked."""
    if not isinstance(body, dict):
        raise HttpError(400, 'the body must be {"ids": [...]} or {"filter": {...}}')
    unknown = sorted(set(body) - {"ids", "filter", "dry_run"})
    if unknown:
        raise HttpError(400, f"unknown field(s): {', '.join(unknown)}")
    if ("ids" in body) == ("filter" in body):
        raise HttpError(400, 'give exactly one of "ids" and "filter"')
    if "ids" in body:
        ids = body["ids"]
        if "dry_run" in body:
            raise HttpError(400, '"dry_run" applies to a filter only')
        if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids
        ):
            raise HttpError(400, '"ids" must be a list of job ids (integers)')
        return ids
    if not isinstance(body.get("dry_run", True), bool):
        raise HttpError(400, '"dry_run" must be true or false')
    return parse_filter(body["filter"])


def parse_filter(raw: Any) -> JobFilter:
    """A filter object from JSON (or a form): queue, state, and RFC 3339 since/until."""
    if not isinstance(raw, dict):
        raise HttpError(400, '"filter" must be an object with at least "queue"')
    unknown = sorted(set(raw) - _FILTER_KEYS)
    if unknown:
        raise HttpError(400, f"unknown filter field(s): {', '.join(unknown)}")
    queue = raw.get("queue")
    # A name no queue can have (a lone surrogate from a JSON escape, a NUL) matches nothing;
    # refused here, it never reaches the database's encoder.
    if isinstance(queue, str) and queue and not is_queue_name(queue):
        raise HttpError(400, f"filter queue: not a queue name ({QUEUE_NAME_RULE})")
    try:
        bounds = {
            name: parse_timestamp(raw[name], name) if raw.get(name) else None
            for name in ("since", "until")
        }
        return JobFilter(queue=queue, state=raw.get("state") or None, **bounds)  # type: ignore[arg-type]
    except (ValueError, InvalidArgument) as exc:
        raise HttpError(400, str(exc)) from None


async def _answer(
    state: ServiceState,
    work: Callable[[Sender], Awaitable[T]],
    render: Callable[[T], Any],
    *,
    action: str | None = None,
) -> Response:
    """Run ``work`` against the database and answer JSON, mapping refusals to 4xx."""
    try:
        result = await in_database(state, work)
    except HttpError as exc:
        return exc.response()
    except InvalidArgument as exc:
        return HttpError(400, str(exc)).response()
    except QueueNotFound as exc:
        return HttpError(404, str(exc)).response()
    except PermissionDenied as exc:
        return HttpError(403, str(exc)).response()
    except KeyContention as exc:
        # Sends of the same keys kept committing under a resume: nothing changed; try again.
        return HttpError(409, str(exc)).response()
    if result is None:
        return HttpError(404, "no such job").response()
    doc = render(result)
    if hasattr(doc, "as_json"):
        doc = doc.as_json(show_data=state.settings.admin_show_data)
    if action is not None:
        log.info("admin.action", action=action, changed=doc.get("changed", doc.get("deleted")))
    return JSONResponse(doc)
