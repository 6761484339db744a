"""``/console``: the operator's web console, server-rendered HTML that needs no JavaScript.

Pages read through the same ``sender.jobs`` / ``sender.queues`` / held-event calls as the CLI and
the admin API. An action is two steps: a GET confirmation page that shows how many jobs it will
change (a dry run) and a POST form carrying a CSRF token, checked with its Origin, that does it
and writes the audit row (``actor_via = 'console'``). Everything shown is escaped by Jinja2's
autoescaping: job data and error texts are untrusted input.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs, urlencode

import anyio
import structlog
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route

from api_sender import Actor, InvalidArgument, JobFilter, PermissionDenied, QueueNotFound, Sender
from api_sender.jobs import ACTION_STATES, STATES, Action, parse_cursor
from api_sender.query import Query

from ...db import statements as db
from ...db.connections import TRANSIENT_ERRORS
from ...jobs.usage.operator import EVERYTHING, HeldStore, Selection
from ...state import ServiceState
from ..guard import HttpError
from .api import parse_filter
from .chart import throughput_svg
from .csrf import Csrf
from .views import queue_names, queues_document, throughput

log = structlog.get_logger("worker.console")

#: The most a console form body may hold (bytes): a few hidden fields.
MAX_FORM_BYTES = 16 * 1024
#: How long the answer to "may this role DELETE?" is reused (seconds).
RIGHTS_TTL = 60.0
#: Whether this role may delete jobs (delete and purge need it; the api role of roles.sql may not).
_CAN_DELETE = Query("can_delete", "SELECT has_table_privilege('{s}.job', 'DELETE')")
VERBS = {
    "retry": "retry",
    "cancel": "cancel",
    "resume": "resume",
    "delete": "delete",
    "pause": "pause",
    "resume_queue": "resume",
    "purge": "purge the waiting jobs of",
    "redrive": "redrive",
    "discard": "discard",
}
#: Headers of every console answer: nothing may run, be framed or be cached.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("worker.http.admin", "templates"),
        autoescape=select_autoescape(["html"], default=True),
    )
    env.filters["when"] = lambda value: (
        value.strftime("%Y-%m-%d %H:%M:%S UTC") if isinstance(value, datetime) else "—"
    )
    env.filters["age"] = _age
    return env


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class _Rights:
    """Whether this process's database role may DELETE from the queue tables (cached)."""

    def __init__(self) -> None:
        self._checked = -float("inf")
        self._can_delete = False

    async def can_delete(self, sender: Sender) -> bool:
        if time.monotonic() - self._checked > RIGHTS_TTL:
            self._can_delete = bool(
                await db.fetchval(sender.pool, _CAN_DELETE.render(sender.schema))
            )
            self._checked = time.monotonic()
        return self._can_delete


def console_routes(state: ServiceState) -> list[BaseRoute]:
    """The console's routes, mounted under /console behind Basic authentication."""
    env = _environment()
    settings = state.settings
    admin_secret = (
        settings.admin_token.get_secret_value().encode() if settings.admin_token else None
    )
    csrf = Csrf(admin_secret or None, settings.console_origin_list)
    rights = _Rights()

    def page(request: Request, template: str, status: int = 200, **context: Any) -> Response:
        principal = request.state.principal
        body = env.get_template(template).render(
            principal=principal, can_act=principal == "admin", states=STATES, **context
        )
        return HTMLResponse(body, status_code=status, headers=SECURITY_HEADERS)

    def failure(request: Request, status: int, heading: str, message: str) -> Response:
        return page(request, "error.html", status, title=heading, heading=heading, message=message)

    def sender_or_none() -> Sender | None:
        return state.sender

    async def guarded(request: Request, view: Any) -> Response:
        sender = sender_or_none()
        if sender is None:
            return failure(request, 503, "Database unreachable", state.not_ready_reason or "")
        try:
            response: Response = await view(sender)
            return response
        except HttpError as exc:
            return failure(request, exc.status, "Not possible", exc.error)
        except InvalidArgument as exc:
            return failure(request, 400, "Not possible", str(exc))
        except QueueNotFound as exc:
            return failure(request, 404, "No such queue", str(exc))
        except PermissionDenied as exc:
            return failure(request, 403, "Not allowed", str(exc))
        except TRANSIENT_ERRORS as exc:
            log.warning("console.database_unreachable", error=f"{type(exc).__name__}: {exc}")
            return failure(request, 503, "Database unreachable", "try again in a moment")

    async def overview(request: Request) -> Response:
        async def view(sender: Sender) -> Response:
            queues = await queues_document(sender.pool, sender.schema)
            minutes = await throughput(sender.pool, sender.schema)
            return page(
                request,
                "overview.html",
                title="Queues",
                nav="overview",
                queues=queues,
                chart=throughput_svg(minutes),
            )

        return await guarded(request, view)

    async def jobs(request: Request) -> Response:
        params = request.query_params
        f = {name: params.get(name) or None for name in ("queue", "state", "key")}

        async def view(sender: Sender) -> Response:
            listing = await sender.jobs.list(
                queue=f["queue"],
                state=f["state"],  # type: ignore[arg-type]
                key=f["key"],
                limit=50,
                after=params.get("after") or None,
            )
            names = await queue_names(sender.pool, sender.schema)
            next_url = "/console/jobs?" + urlencode(
                {k: v for k, v in {**f, "after": listing.next}.items() if v}
            )
            can_delete = await rights.can_delete(sender)
            return page(
                request,
                "jobs.html",
                title="Jobs",
                nav="jobs",
                page=listing,
                f=f,
                queue_names=names,
                next_url=next_url,
                bulk_actions=[a for a in ACTION_STATES if a != "delete" or can_delete],
            )

        return await guarded(request, view)

    async def job(request: Request) -> Response:
        async def view(sender: Sender) -> Response:
            try:
                job_id = parse_cursor(request.path_params["id"])
            except InvalidArgument:
                return failure(request, 404, "No such job", "that is not a job id")
            found = await sender.jobs.get(job_id)
            if found is None:
                return failure(request, 404, "No such job", f"job {job_id} does not exist")
            can_delete = await rights.can_delete(sender)
            return page(
                request,
                "job.html",
                title=f"Job {found.id}",
                nav="jobs",
                job=found,
                show_data=settings.admin_show_data,
                data_text=json.dumps(found.data, indent=2, ensure_ascii=False),
                job_actions=[a for a, states in ACTION_STATES.items() if found.state in states],
                rights_missing=[] if can_delete else ["delete"],
            )

        return await guarded(request, view)

    async def held(request: Request) -> Response:
        async def view(sender: Sender) -> Response:
            store = HeldStore(sender)
            rows = await store.listing(limit=200)
            total = len(rows) if len(rows) < 200 else await store.count()
            return page(
                request, "held.html", title="Held usage", nav="held", rows=rows, total=total
            )

        return await guarded(request, view)

    async def confirm(request: Request) -> Response:
        params = request.query_params

        async def view(sender: Sender) -> Response:
            plan = await _plan(sender, params, rights)
            return page(
                request,
                "confirm.html",
                title="Confirm",
                csrf=csrf.token(),
                **plan,
            )

        return await guarded(request, view)

    async def act(request: Request) -> Response:
        if not csrf.same_origin(request):
            log.warning("console.origin_refused", origin=request.headers.get("origin"))
            return failure(request, 403, "Refused", "this form was not sent from the console")
        form = await _read_form(request, settings.http_body_timeout_seconds)
        if form is None:
            return failure(request, 400, "Refused", "not a console form")
        if not csrf.valid(form.get("csrf", "")):
            log.warning("console.csrf_refused")
            return failure(request, 403, "Refused", "the form has expired or was not made here")
        actor = Actor("console", request.state.principal)

        async def view(sender: Sender) -> Response:
            message, back, changed = await _perform(sender, form, actor)
            expected = form.get("expected")
            log.info(
                "console.action",
                kind=form.get("kind"),
                action=form.get("action"),
                changed=changed,
                principal=actor.principal,
            )
            return page(
                request,
                "done.html",
                title="Done",
                message=message,
                back=back,
                changed=changed,
                expected=int(expected) if expected and expected.isdigit() else None,
            )

        return await guarded(request, view)

    return [
        Route("/", overview, methods=["GET"]),
        Route("/jobs", jobs, methods=["GET"]),
        Route("/jobs/{id}", job, methods=["GET"]),
        Route("/held", held, methods=["GET"]),
        Route("/confirm", confirm, methods=["GET"]),
        Route("/act", act, methods=["POST"]),
    ]


async def _read_form(request: Request, timeout: float) -> dict[str, str] | None:
    """A small urlencoded form body (last value per field) read within ``timeout`` seconds,
    or None for anything else."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        return None
    body = bytearray()
    try:
        with anyio.fail_after(timeout):
            async for chunk in request.stream():
                body.extend(chunk)
                if len(body) > MAX_FORM_BYTES:
                    return None
    except TimeoutError:
        return None
    try:
        parsed = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=50)
    except (UnicodeDecodeError, ValueError):
        return None
    out = {name: values[-1] for name, values in parsed.items()}
    if any("\x00" in v for v in out.values()):
        return None
    out["_ids"] = ",".join(parsed.get("id", []))
    return out


def _ids(values: list[str]) -> list[int]:
    ids = []
    for value in values:
        try:
            ids.append(parse_cursor(value.strip()))
        except InvalidArgument:
            raise HttpError(400, f"{value[:40]!r} is not a job id") from None
    if not ids:
        raise HttpError(400, "no job id given")
    return ids


def _action(value: str | None, allowed: tuple[str, ...]) -> str:
    if value is None or value not in allowed:
        raise HttpError(400, "unknown action")
    return value


def _job_action(value: str | None) -> Action:
    for action in ACTION_STATES:
        if value == action:
            return action
    raise HttpError(400, "unknown action")


def _filter_of(params: Mapping[str, str]) -> JobFilter:
    return parse_filter(
        {k: params[k] for k in ("queue", "state", "since", "until") if params.get(k)}
    )


async def _plan(sender: Sender, params: Mapping[str, str], rights: _Rights) -> dict[str, Any]:
    """What a confirmation page shows: the count it will change, and the form's fields."""
    kind = params.get("kind")
    if kind == "job":
        action = _job_action(params.get("action"))
        [job_id] = _ids([params.get("id", "")])
        if action == "delete" and not await rights.can_delete(sender):
            raise PermissionDenied("jobs.delete", "this database role has no DELETE")
        job = await sender.jobs.get(job_id)
        if job is None:
            raise HttpError(404, f"job {job_id} does not exist")
        count = 1 if job.state in ACTION_STATES[action] else 0
        return {
            "kind": kind,
            "action": action,
            "verb": VERBS[action],
            "noun": "job",
            "count": count,
            "scope": f"job {job_id} ({job.queue}, {job.state})",
            "note": None if count else f"The job is {job.state}: {action} does not apply.",
            "fields": [("id", str(job_id))],
            "danger": action in ("delete", "cancel"),
            "back": f"/console/jobs/{job_id}",
        }
    if kind == "filter":
        action = _job_action(params.get("action"))
        if action == "delete" and not await rights.can_delete(sender):
            raise PermissionDenied("jobs.delete", "this database role has no DELETE")
        where = _filter_of(params)
        count = (await sender.jobs.act_where(action, where, dry_run=True)).changed
        bounds = "".join(
            f", created {word} {value}"
            for word, value in (("from", where.since), ("before", where.until))
            if value is not None
        )
        shown = f"every {where.state + ' ' if where.state else ''}job of queue {where.queue}"
        return {
            "kind": kind,
            "action": action,
            "verb": VERBS[action],
            "noun": "job",
            "count": count,
            "scope": shown + bounds,
            "note": "The count is taken now; jobs that change meanwhile are counted again when "
            "you confirm.",
            "fields": [(k, v) for k, v in where.as_json().items() if v],
            "danger": action in ("delete", "cancel"),
            "back": "/console/jobs?"
            + urlencode({"queue": where.queue, "state": where.state or ""}),
        }
    if kind == "queue":
        action_name = _action(params.get("action"), ("pause", "resume", "purge"))
        queue = params.get("queue") or ""
        if action_name == "purge" and not await rights.can_delete(sender):
            raise PermissionDenied("queues.purge", "this database role has no DELETE")
        if action_name == "purge":
            where = JobFilter(queue=queue)
            count = await sender.jobs.count_waiting(where)
            noun = "waiting job"
        else:
            count, noun = 1, "queue"
        return {
            "kind": kind,
            "action": action_name,
            "verb": VERBS["resume_queue" if action_name == "resume" else action_name],
            "noun": noun,
            "count": count,
            "scope": f"queue {queue}",
            "note": "Running jobs finish; sends are still accepted and cron keeps enqueueing."
            if action_name == "pause"
            else None,
            "fields": [("queue", queue)],
            "danger": action_name == "purge",
            "back": "/console/",
        }
    if kind == "held":
        action_name = _action(params.get("action"), ("redrive", "discard"))
        selection = _held_selection(params.get("id"), params.get("all"))
        if action_name == "discard" and selection.everything:
            raise HttpError(400, "discard names the events one by one")
        store = HeldStore(sender)
        count = (
            len(await store.listing(selection)) if not selection.everything else await store.count()
        )
        return {
            "kind": kind,
            "action": action_name,
            "verb": VERBS[action_name],
            "noun": "held event",
            "count": count,
            "scope": "every held event" if selection.everything else f"event {params.get('id')}",
            "note": "A discarded event is never delivered to the hub."
            if action_name == "discard"
            else "The events go back to the usage queue, due now.",
            "fields": [("all", "1")] if selection.everything else [("id", params.get("id", ""))],
            "danger": action_name == "discard",
            "back": "/console/held",
        }
    raise HttpError(400, "unknown kind of action")


def _held_selection(event_id: str | None, everything: str | None) -> Selection:
    if everything == "1":
        return EVERYTHING
    try:
        return Selection.of([event_id or ""])
    except ValueError as exc:
        raise HttpError(400, f"invalid event id: {exc}") from None


async def _perform(sender: Sender, form: dict[str, str], actor: Actor) -> tuple[str, str, int]:
    """Do the confirmed action; (message, back link, how many changed)."""
    kind = form.get("kind")
    if kind == "job":
        action = _job_action(form.get("action"))
        ids = _ids(form["_ids"].split(",") if form.get("_ids") else [])
        result = await sender.jobs.as_actor(actor).act(action, ids)
        return (
            f"{action}: {result.changed} job(s) changed.",
            f"/console/jobs/{ids[0]}",
            result.changed,
        )
    if kind == "filter":
        action = _job_action(form.get("action"))
        where = _filter_of(form)
        result = await sender.jobs.as_actor(actor).act_where(action, where, dry_run=False)
        back = "/console/jobs?" + urlencode({"queue": where.queue, "state": where.state or ""})
        return f"{action}: {result.changed} job(s) changed.", back, result.changed
    if kind == "queue":
        action_name = _action(form.get("action"), ("pause", "resume", "purge"))
        queue = form.get("queue") or ""
        api = sender.queues.as_actor(actor)
        if action_name == "purge":
            n = await api.purge(queue)
            return f"purged {n} waiting job(s) of {queue}.", "/console/", n
        changed = await (api.pause(queue) if action_name == "pause" else api.resume(queue))
        word = "paused" if action_name == "pause" else "resumed"
        return (
            f"{queue} {word}." if changed else f"{queue} was already {word}.",
            "/console/",
            int(changed),
        )
    if kind == "held":
        action_name = _action(form.get("action"), ("redrive", "discard"))
        selection = _held_selection(form.get("id"), form.get("all"))
        store = HeldStore(sender)
        if action_name == "redrive":
            done = await store.redrive(selection, actor)
        else:
            if selection.everything:
                raise HttpError(400, "discard names the events one by one")
            done = await store.discard(selection, actor)
        return f"{action_name}: {len(done)} event(s).", "/console/held", len(done)
    raise HttpError(400, "unknown kind of action")
