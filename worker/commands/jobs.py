"""``chassis-worker jobs ...`` and ``queues pause|resume|purge`` (contract section 10).

The CLI runs with the database's own rights and shows job data in full. Every action writes one
audit row (``actor_via = 'cli'``, the OS user); a filter action without ``--yes`` only prints the
count and changes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any

from api_sender import Actor, Job, JobFilter
from api_sender.events import parse_timestamp
from api_sender.jobs import ACTION_STATES, STATES, Action, ids_of

from ..boot import database_url
from ..settings import Settings
from .held import operator_name
from .output import UsageError, print_json
from .senders import sender_for

ACTIONS: tuple[Action, ...] = tuple(ACTION_STATES)
PAST = {"retry": "retried", "cancel": "cancelled", "resume": "resumed", "delete": "deleted"}


def add_jobs_parser(sub: Any) -> None:
    """Register ``jobs list|show|retry|cancel|resume|delete``."""
    jobs = sub.add_parser("jobs", help="look at jobs and act on them")
    actions = jobs.add_subparsers(dest="jobs_action", required=True)
    listing = actions.add_parser("list", help="jobs, newest first")
    listing.add_argument("--queue")
    listing.add_argument("--state", choices=STATES)
    listing.add_argument("--key")
    listing.add_argument("--limit", type=int, default=50, help="jobs per page (1-1000) [50]")
    listing.add_argument("--after", metavar="CURSOR", help="the next cursor of a previous page")
    listing.add_argument("--json", action="store_true")
    show = actions.add_parser("show", help="every field of one job, its error and its data")
    show.add_argument("id")
    show.add_argument("--json", action="store_true")
    for action in ACTIONS:
        act = actions.add_parser(
            action,
            help=f"{action} jobs by id, or every job matching --queue/--state (count first)",
        )
        act.add_argument("ids", nargs="*", metavar="ID")
        act.add_argument("--queue")
        act.add_argument("--state", choices=STATES)
        act.add_argument("--since", metavar="RFC3339", help="created at or after")
        act.add_argument("--until", metavar="RFC3339", help="created before")
        act.add_argument("--yes", action="store_true", help="do it (without: print the count)")


def add_queue_actions(queues: argparse.ArgumentParser) -> None:
    """Register ``queues pause|resume Q`` and ``queues purge Q --yes`` under ``queues``."""
    actions = queues.add_subparsers(dest="queue_action", required=False)
    for name, text in (
        ("pause", "no replica starts a job of the queue until resume"),
        ("resume", "start the queue's jobs again, at once"),
        ("purge", "delete the queue's waiting jobs (created and retry)"),
    ):
        action = actions.add_parser(name, help=text)
        action.add_argument("queue")
        if name == "purge":
            action.add_argument("--yes", action="store_true", help="do it (without: the count)")


async def jobs_command(settings: Settings, args: argparse.Namespace) -> int:
    """Dispatch ``jobs ...``; 0 done, 1 a named job does not exist, 2 bad arguments."""
    action = args.jobs_action
    target = _target(args, UsageError) if action in ACTIONS else None
    url = await database_url(settings)
    async with sender_for(settings, url) as sender:
        jobs = sender.jobs.as_actor(Actor("cli", operator_name()))
        if action == "list":
            page = await jobs.list(
                queue=args.queue,
                state=args.state,
                key=args.key,
                limit=args.limit,
                after=args.after,
            )
            if args.json:
                print_json({"jobs": [j.as_json() for j in page.jobs], "next": page.next})
            else:
                _print_jobs(page.jobs, page.next)
            return 0
        if action == "show":
            [job_id] = _ids([args.id], UsageError)
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
                print(f"would {action} {result.changed} job(s); pass --yes to do it")
                return 0
            print(f"{PAST[action]} {result.changed} job(s)")
            return 0
        assert target is not None
        changed = (await jobs.act(action, target)).ids
        print(f"{PAST[action]} {len(changed)} of {len(target)} job(s)")
        for job_id in changed:
            print(job_id)
        return 0


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
        return _ids(args.ids, usage_error)
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


def _ids(values: list[str], usage_error: type[Exception]) -> list[int]:
    try:
        return ids_of(values)
    except ValueError as exc:
        raise usage_error(str(exc)) from None


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
                job.queue,
                job.state,
                f"{job.attempt}/{job.retry_limit + 1}",
                job.created_at.isoformat(timespec="seconds"),
                job.singleton_key or "-",
                error[:80] + ("…" if len(error) > 80 else ""),
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
        print(f"{key.ljust(width)}  {'-' if value is None else value}")
    print("error:")
    print(f"  {error}" if error else "  -")
    print("data:")
    print(json.dumps(data, indent=2, ensure_ascii=False))
