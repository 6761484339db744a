"""``/console``: the operator's web console, server-rendered HTML that needs no JavaScript.

Pages read through the same ``sender.jobs`` / ``sender.queues`` / held-event calls as the CLI and
the admin API. An action is two steps: a GET confirmation page that shows how many jobs it will
change (a dry run) and a POST form carrying a CSRF token, checked with its Origin, that does it
and writes the audit row (``actor_via = 'console'``). Everything shown is escaped by Jinja2's
autoescaping: job data and error texts are untrusted input.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import parse_qs, urlencode

import anyio
import structlog
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route

from api_sender import Actor, InvalidArgument, JobFilter, PermissionDenied, QueueNotFound, Sender
from api_sender.jobs import ACTION_STATES, STATES, Action, KeyContention
from api_sender.query import Query

from ...db import statements as db
from ...db.connections import TRANSIENT_ERRORS
from ...jobs.usage.operator import EVERYTHING, JOB_PREFIX, HeldRow, HeldStore, Selection
from ...state import ServiceState
from ..guard import HttpError
from ..inputs import JOB_ID_RULE, QUEUE_NAME_RULE, ascii_int, is_queue_name, job_id
from .api import parse_filter
from .chart import throughput_svg
from .csrf import Csrf
from .views import data_sizes, queue_names, queues_document, throughput

log = structlog.get_logger("worker.console")

#: The most a console form body may hold (bytes): a few hidden fields.
MAX_FORM_BYTES = 16 * 1024
#: How long the answer to "may this role DELETE?" is reused (seconds).
RIGHTS_TTL = 60.0
#: A held event's id as the console takes it: printable ASCII (a ULID, as ingest makes them),
#: or ``job:<job id>`` for data without one.
_EVENT_ID = re.compile(r"[\x21-\x7e]{1,200}")
HELD_ID_RULE = "a held event id is its event id (a ULID) or job:<job id>"
#: An ``expected`` count of a form: what a confirmation page counted (at most a bigint's digits).
_MAX_COUNT_DIGITS = 19
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
        except KeyContention as exc:
            return failure(request, 409, "Not possible now", str(exc))
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
        after = params.get("after") or None
        if after is not None and job_id(after) is None:
            return failure(request, 400, "Not possible", "after: not a cursor of a job list page")

        async def view(sender: Sender) -> Response:
            listing = await sender.jobs.list(
                queue=f["queue"],
                state=f["state"],  # type: ignore[arg-type]
                key=f["key"],
                limit=50,
                after=after,
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
            wanted = job_id(request.path_params["id"])
            if wanted is None:
                return failure(request, 404, "No such job", f"that is not a job id: {JOB_ID_RULE}")
            found = await sender.jobs.get(wanted)
            if found is None:
                return failure(request, 404, "No such job", f"job {wanted} does not exist")
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
            show = settings.admin_show_data
            sizes = (
                {}
                if show
                else await data_sizes(sender.pool, sender.schema, [row.job_id for row in rows])
            )
            return page(
                request,
                "held.html",
                title="Held usage",
                nav="held",
                rows=[held_view(row, show_data=show, sizes=sizes) for row in rows],
                total=total,
                show_data=show,
            )

        return await guarded(request, view)

    async def confirm(request: Request) -> Response:
        params = request.query_params

        async def view(sender: Sender) -> Response:
            plan = await _plan(sender, parse_action(params, [params.get("id", "")]), rights)
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
        # Every field is checked before anything is written: a bad one refuses the whole form.
        try:
            planned = parse_action(form, form["_ids"].split(",") if form.get("_ids") else [])
        except HttpError as exc:
            return failure(request, exc.status, "Not possible", exc.error)
        actor = Actor("console", request.state.principal)

        async def view(sender: Sender) -> Response:
            message, back, changed = await _perform(sender, planned, actor)
            log.info(
                "console.action",
                kind=planned.kind,
                action=planned.action,
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
                expected=planned.expected,
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


def _instant(value: Any) -> datetime | Any:
    """An event's RFC 3339 ``occurred_at`` as a UTC instant (shown like every other time on the
    page), or the value as it is when it is not one."""
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return value
        if parsed.tzinfo is not None:
            return parsed.astimezone(UTC)
    return value


def held_view(row: HeldRow, *, show_data: bool, sizes: Mapping[int, int]) -> dict[str, Any]:
    """What the held page shows of one event. Its id, status, hold reason and due time are the
    operator's to see; its body (meter, workspace, quantity, when it occurred, dimensions) is
    the customer's data, shown only with ADMIN_SHOW_DATA (else its size, as job data is)."""
    shown: dict[str, Any] = {
        "id": row.id,
        "status": row.status,
        "reason": row.reason,
        "due_at": row.due_at,
    }
    if not show_data:
        return {**shown, "bytes": sizes.get(row.job_id)}
    body = row.data if isinstance(row.data, dict) else {}
    dimensions = body.get("dimensions")
    return {
        **shown,
        "meter": body.get("meter"),
        "workspace_id": body.get("workspace_id"),
        "quantity": body.get("quantity"),
        "occurred_at": _instant(body.get("occurred_at")),
        "dimensions": json.dumps(dimensions, ensure_ascii=False) if dimensions else None,
    }


Kind = Literal["job", "filter", "queue", "held"]


@dataclass(frozen=True, slots=True)
class ConsoleAction:
    """One console action with every field checked: what a confirmation page counts, and what
    its form, once confirmed, does."""

    kind: Kind
    action: str
    #: kind job: the job ids.
    ids: tuple[int, ...] = ()
    #: kind filter: the jobs matched.
    where: JobFilter | None = None
    #: kind queue: the queue.
    queue: str = ""
    #: kind held: the events, and the id as given (shown and carried by the form).
    selection: Selection = EVERYTHING
    held_id: str = ""
    #: What the confirmation page counted, carried by its form (shown beside what changed).
    expected: int | None = None


def parse_action(fields: Mapping[str, str], ids: Sequence[str]) -> ConsoleAction:
    """The action a confirmation page's query or an action form names, every field checked
    (:class:`HttpError` 400 naming the first bad one). ``ids``: the job ids given."""
    expected = fields.get("expected")
    count = None if expected is None else ascii_int(expected, max_digits=_MAX_COUNT_DIGITS)
    if expected is not None and count is None:
        raise HttpError(400, "expected: not a count of jobs (ASCII digits)")
    kind = fields.get("kind")
    if kind == "job":
        job_action = _job_action(fields.get("action"))
        return ConsoleAction("job", job_action, ids=tuple(_ids(ids)), expected=count)
    if kind == "filter":
        job_action = _job_action(fields.get("action"))
        return ConsoleAction("filter", job_action, where=_filter_of(fields), expected=count)
    if kind == "queue":
        action = _action(fields.get("action"), ("pause", "resume", "purge"))
        queue = fields.get("queue") or ""
        if not is_queue_name(queue):
            raise HttpError(400, f"queue: not a queue name ({QUEUE_NAME_RULE})")
        return ConsoleAction("queue", action, queue=queue, expected=count)
    if kind == "held":
        action = _action(fields.get("action"), ("redrive", "discard"))
        selection = _held_selection(fields.get("id"), fields.get("all"))
        if action == "discard" and selection.everything:
            raise HttpError(400, "discard names the events one by one")
        held_id = "" if selection.everything else (fields.get("id") or "").strip()
        return ConsoleAction("held", action, selection=selection, held_id=held_id, expected=count)
    raise HttpError(400, "unknown kind of action")


def _ids(values: Sequence[str]) -> list[int]:
    ids = []
    for value in values:
        found = job_id(value.strip())
        if found is None:
            raise HttpError(400, f"{value[:40]!r} is not a job id: {JOB_ID_RULE}")
        ids.append(found)
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


def _held_selection(event_id: str | None, everything: str | None) -> Selection:
    if everything == "1":
        return EVERYTHING
    text = (event_id or "").strip()
    # Checked here, not left to the database: a NUL or a job id past a bigint is the caller's
    # mistake (400), not a database error.
    if text.lower().startswith(JOB_PREFIX):
        valid = job_id(text[len(JOB_PREFIX) :]) is not None
    else:
        valid = _EVENT_ID.fullmatch(text) is not None
    if not valid:
        raise HttpError(400, f"id: not a held event id ({HELD_ID_RULE})")
    try:
        return Selection.of([text])
    except ValueError as exc:
        raise HttpError(400, f"invalid event id: {exc}") from None


async def _plan(sender: Sender, planned: ConsoleAction, rights: _Rights) -> dict[str, Any]:
    """What a confirmation page shows: the count it will change, and the form's fields."""
    action = planned.action
    if planned.kind == "job":
        job_id_ = planned.ids[0]
        if action == "delete" and not await rights.can_delete(sender):
            raise PermissionDenied("jobs.delete", "this database role has no DELETE")
        job = await sender.jobs.get(job_id_)
        if job is None:
            raise HttpError(404, f"job {job_id_} does not exist")
        count = 1 if job.state in ACTION_STATES[_job_action(action)] else 0
        return {
            "kind": planned.kind,
            "action": action,
            "verb": VERBS[action],
            "noun": "job",
            "count": count,
            "scope": f"job {job_id_} ({job.queue}, {job.state})",
            "note": None if count else f"The job is {job.state}: {action} does not apply.",
            "fields": [("id", str(job_id_))],
            "danger": action in ("delete", "cancel"),
            "back": f"/console/jobs/{job_id_}",
        }
    if planned.kind == "filter" and planned.where is not None:
        where = planned.where
        if action == "delete" and not await rights.can_delete(sender):
            raise PermissionDenied("jobs.delete", "this database role has no DELETE")
        count = (await sender.jobs.act_where(_job_action(action), where, dry_run=True)).changed
        bounds = "".join(
            f", created {word} {value}"
            for word, value in (("from", where.since), ("before", where.until))
            if value is not None
        )
        shown = f"every {where.state + ' ' if where.state else ''}job of queue {where.queue}"
        return {
            "kind": planned.kind,
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
    if planned.kind == "queue":
        queue = planned.queue
        if action == "purge" and not await rights.can_delete(sender):
            raise PermissionDenied("queues.purge", "this database role has no DELETE")
        if action == "purge":
            count = await sender.jobs.count_waiting(JobFilter(queue=queue))
            noun = "waiting job"
        else:
            count, noun = 1, "queue"
        return {
            "kind": planned.kind,
            "action": action,
            "verb": VERBS["resume_queue" if action == "resume" else action],
            "noun": noun,
            "count": count,
            "scope": f"queue {queue}",
            "note": "Running jobs finish; sends are still accepted and cron keeps enqueueing."
            if action == "pause"
            else None,
            "fields": [("queue", queue)],
            "danger": action == "purge",
            "back": "/console/",
        }
    if planned.kind == "held":
        selection = planned.selection
        store = HeldStore(sender)
        count = (
            len(await store.listing(selection)) if not selection.everything else await store.count()
        )
        return {
            "kind": planned.kind,
            "action": action,
            "verb": VERBS[action],
            "noun": "held event",
            "count": count,
            "scope": "every held event" if selection.everything else f"event {planned.held_id}",
            "note": "A discarded event is never delivered to the hub."
            if action == "discard"
            else "The events go back to the usage queue, due now.",
            "fields": [("all", "1")] if selection.everything else [("id", planned.held_id)],
            "danger": action == "discard",
            "back": "/console/held",
        }
    raise HttpError(400, "unknown kind of action")


async def _perform(sender: Sender, planned: ConsoleAction, actor: Actor) -> tuple[str, str, int]:
    """Do the confirmed (and checked) action; (message, back link, how many changed)."""
    action = planned.action
    if planned.kind == "job":
        ids = list(planned.ids)
        result = await sender.jobs.as_actor(actor).act(_job_action(action), ids)
        return (
            f"{action}: {result.changed} job(s) changed.",
            f"/console/jobs/{ids[0]}",
            result.changed,
        )
    if planned.kind == "filter" and planned.where is not None:
        where = planned.where
        result = await sender.jobs.as_actor(actor).act_where(
            _job_action(action), where, dry_run=False
        )
        back = "/console/jobs?" + urlencode({"queue": where.queue, "state": where.state or ""})
        return f"{action}: {result.changed} job(s) changed.", back, result.changed
    if planned.kind == "queue":
        queue = planned.queue
        api = sender.queues.as_actor(actor)
        if action == "purge":
            n = await api.purge(queue)
            return f"purged {n} waiting job(s) of {queue}.", "/console/", n
        changed = await (api.pause(queue) if action == "pause" else api.resume(queue))
        word = "paused" if action == "pause" else "resumed"
        return (
            f"{queue} {word}." if changed else f"{queue} was already {word}.",
            "/console/",
            int(changed),
        )
    if planned.kind == "held":
        store = HeldStore(sender)
        if action == "redrive":
            done = await store.redrive(planned.selection, actor)
        else:
            done = await store.discard(planned.selection, actor)
        return f"{action}: {len(done)} event(s).", "/console/held", len(done)
    raise HttpError(400, "unknown kind of action")
