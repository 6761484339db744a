"""``chassis-worker jobs ...`` and ``queues pause|resume|purge`` (contract section 10).

The CLI runs with the database's own rights and shows job data in full. Every action writes one
audit row (``actor_via = 'cli'``, the OS user); a filter action without ``--yes`` only prints the
count and changes nothing. Every number it takes (ids, ``--after``, ``--limit``) is checked as
ASCII digits within range before anything connects: a bad one is exit 2 with one line. Job
fields are untrusted text: the human output escapes their control characters
(:func:`~.output.shown`); ``--json`` is JSON, safe as it is.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime

from api_sender import Actor, InvalidArgument, Job, JobFilter
from api_sender.events import parse_timestamp
from api_sender.jobs import MAX_PAGE, ActionResult, KeyContention, decimal_id, ids_of, parse_cursor

from ..boot import database_url
from ..settings import Settings
from .arguments import ACTIONS
from .held import operator_name
from .output import UsageError, print_json, shown
from .senders import sender_for

PAST = {"retry": "retried", "cancel": "cancelled", "resume": "resumed", "delete": "deleted"}
#: Why resume and retry leave a job alone (ActionResult.skipped).
SKIPPED = "skipped: their key has a job waiting, or got back a newer one"


async def jobs_command(settings: Settings, args: argparse.Namespace) -> int:
    """Dispatch ``jobs ...``; 0 done, 1 a named job does not exist, 2 bad arguments."""
    try:
        return await _jobs_command(settings, args)
    except InvalidArgument as exc:  # what only the database could tell (too many key locks)
        raise UsageError(f"jobs {args.jobs_action}: {exc}") from None
    except KeyContention as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


async def _jobs_command(settings: Settings, args: argparse.Namespace) -> int:
    action = args.jobs_action
    # Every argument is checked before anything connects: a bad one changes nothing.
    target = _target(args, UsageError) if action in ACTIONS else None
    limit = _limit(args.limit) if action == "list" else 0
    after = _after(args.after) if action == "list" else None
    [job_id] = _ids([args.id], UsageError, "jobs show") if action == "show" else [0]
    url = await database_url(settings)
    async with sender_for(settings, url) as sender:
        jobs = sender.jobs.as_actor(Actor("cli", operator_name()))
        if action == "list":
            page = await jobs.list(
                queue=args.queue, state=args.state, key=args.key, limit=limit, after=after
            )
            if args.json:
                print_json({"jobs": [j.as_json() for j in page.jobs], "next": page.next})
            else:
                _print_jobs(page.jobs, page.next)
            return 0
        if action == "show":
            job = await jobs.get(job_id)
            if job is None:
                print(f"no job {job_id}", file=sys.stderr)
                return 1
            if args.json:
                print_json(job.as_json())
            else:
                _print_job(job)
            return 0
        if isinstance(target, JobFilter):
            result = await jobs.act_where(action, target, dry_run=not args.yes)
            if not args.yes:
                print(
                    f"would {action} {result.changed} job(s){_skipped(result)}; pass --yes to do it"
                )
                return 0
            print(f"{PAST[action]} {result.changed} job(s){_skipped(result)}")
            return 0
        assert target is not None
        result = await jobs.act(action, target)
        print(f"{PAST[action]} {len(result.ids)} of {len(target)} job(s){_skipped(result)}")
        for changed in result.ids:
            print(changed)
        return 0


def _skipped(result: ActionResult) -> str:
    return f" ({result.skipped} {SKIPPED})" if result.skipped else ""


async def queue_action_command(settings: Settings, args: argparse.Namespace) -> int:
    """``queues pause|resume Q`` and ``queues purge Q [--yes]``."""
    url = await database_url(settings)
    async with sender_for(settings, url) as sender:
        queue = args.queue
        if args.queue_action == "purge" and not args.yes:
            n = await sender.jobs.count_waiting(JobFilter(queue=queue))
            print(f"would purge {n} waiting job(s) of {queue}; pass --yes to do it")
            return 0
        api = sender.queues.as_actor(Actor("cli", operator_name()))
        if args.queue_action == "purge":
            print(f"purged {await api.purge(queue)} waiting job(s) of {queue}")
        elif args.queue_action == "pause":
            done = await api.pause(queue)
            print(f"{queue} paused" if done else f"{queue} was already paused")
        else:
            done = await api.resume(queue)
            print(f"{queue} resumed" if done else f"{queue} was not paused")
    return 0


def _target(args: argparse.Namespace, usage_error: type[Exception]) -> list[int] | JobFilter:
    filtering = any(getattr(args, n) for n in ("queue", "state", "since", "until"))
    if args.ids and filtering:
        raise usage_error(f"jobs {args.jobs_action}: give job ids or a filter, not both")
    if args.ids:
        if args.yes:
            raise usage_error(f"jobs {args.jobs_action}: --yes applies to a filter only")
        return _ids(args.ids, usage_error, f"jobs {args.jobs_action}")
    if not args.queue:
        raise usage_error(f"jobs {args.jobs_action}: give job ids, or --queue (and --state)")
    try:
        return JobFilter(
            queue=args.queue,
            state=args.state,
            since=_when(args.since, "--since"),
            until=_when(args.until, "--until"),
        )
    except ValueError as exc:
        raise usage_error(f"jobs {args.jobs_action}: {exc}") from None


def _when(value: str | None, name: str) -> datetime | None:
    return parse_timestamp(value, name) if value else None


def _ids(values: list[str], usage_error: type[Exception], command: str) -> list[int]:
    try:
        return ids_of(values)
    except ValueError as exc:
        raise usage_error(f"{command}: {exc}") from None


def _limit(value: str) -> int:
    """``--limit``: ASCII digits from 1 to MAX_PAGE (int() takes other scripts' digits)."""
    number = decimal_id(value)
    if number is None or number > MAX_PAGE:
        raise UsageError(
            f"jobs list: --limit must be an integer from 1 to {MAX_PAGE}, not {value[:40]!r}"
        )
    return number


def _after(value: str | None) -> str | None:
    """``--after``: the next cursor of a previous page (checked here, passed on as text)."""
    if value is None:
        return None
    try:
        parse_cursor(value)
    except InvalidArgument:
        raise UsageError(
            f"jobs list: --after must be the next cursor of a previous page, not {value[:40]!r}"
        ) from None
    return value


def _print_jobs(jobs: list[Job], next_cursor: str | None) -> None:
    if not jobs:
        print("no jobs")
        return
    lines = [["id", "queue", "state", "attempt", "created_at", "key", "error"]]
    for job in jobs:
        error = (job.error or "").replace("\n", " ")
        lines.append(
            [
                str(job.id),
                shown(job.queue),
                job.state,
                f"{job.attempt}/{job.retry_limit + 1}",
                job.created_at.isoformat(timespec="seconds"),
                shown(job.singleton_key or "-"),
                shown(error[:80]) + ("…" if len(error) > 80 else ""),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for line in lines:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))
    if next_cursor:
        print(f"more: --after {next_cursor}")


def _print_job(job: Job) -> None:
    doc = job.as_json()
    data, error = doc.pop("data"), doc.pop("error")
    width = max(len(k) for k in doc)
    for key, value in doc.items():
        print(f"{key.ljust(width)}  {'-' if value is None else shown(value)}")
    print("error:")
    # A traceback keeps its lines, each indented under the heading.
    print(
        "\n".join(f"  {line}" for line in shown(error, lines=True).split("\n")) if error else "  -"
    )
    print("data:")
    # Full characters (ensure_ascii=False), but no control character raw: as JSON escapes.
    print(shown(json.dumps(data, indent=2, ensure_ascii=False), lines=True, json_text=True))
