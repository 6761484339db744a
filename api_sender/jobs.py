"""``sender.jobs``: look at jobs and act on them (contract section 10).

Reads are keyset-paginated, newest first. Every action writes its audit row in the statement
that changes the jobs (:mod:`api_sender.job_queries`); an action by ids returns the ids it
changed, leaving ids in another state alone; an action by filter (``*_where``) returns how many
it changed, or with ``dry_run=True`` (the default) how many it would change, without changing or
recording anything.

Resume and retry keep each key's promise (one pending timer per key; one created job per key on
a short or stately queue): of the jobs they match, a key gets back its newest one only, and none
while another job of it holds the place. The others are left alone and counted:
:meth:`JobsApi.act` and :meth:`JobsApi.act_where` answer an :class:`ActionResult` whose
``skipped`` says how many (``retry``/``resume`` and ``*_where`` keep answering ids and counts).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypedDict, TypeVar, Unpack, cast

from . import job_queries as q
from .driver import AsyncDriver, SyncDriver, run_async, run_sync
from .errors import InvalidArgument, PermissionDenied, SenderError
from .operation import ErrorMap, Op, Rows, Step, first, one
from .query import Query

T = TypeVar("T")

State = Literal["created", "retry", "active", "completed", "cancelled", "failed"]
#: pg-boss's states, in the order of the job_state enum.
STATES = cast("tuple[State, ...]", q.JOB_STATES)
Action = Literal["retry", "cancel", "resume", "delete"]
#: The states each action moves jobs out of.
ACTION_STATES: dict[Action, tuple[State, ...]] = {
    "retry": ("failed", "cancelled"),
    "cancel": ("created", "retry", "active"),
    "resume": ("cancelled",),
    "delete": STATES,
}
#: Job ids (an alias: inside JobsApi, ``list`` is the method).
IdList = list[int]
#: The most jobs one list page holds, and the most changed ids one filter action returns.
MAX_PAGE = 1000
MAX_IDS_SHOWN = 1000
#: The most key locks one resume or retry takes (one per timer key and one per short or stately
#: queue whose place is free): each holds a slot of the server's shared lock table, about
#: 64 per connection by default (max_locks_per_transaction), to the end of the transaction.
MAX_KEY_LOCKS = 1000
#: How many times a resume runs when a send of the same key commits under it.
KEY_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts, for the audit row: the surface (``actor_via``) and the principal."""

    via: Literal["cli", "api", "console", "python"] = "python"
    principal: str | None = None


@dataclass(frozen=True, slots=True)
class Job:
    """One job as the operator surfaces show it."""

    id: int
    queue: str
    state: State
    data: Any
    priority: int
    singleton_key: str | None
    attempt: int
    retry_count: int
    retry_limit: int
    start_after: datetime
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    #: The last failure's text, or ``None``.
    error: str | None
    #: The size of the job's data as stored JSON text (``octet_length(data::text)``).
    data_bytes: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Job:
        """A job from a row of :data:`api_sender.job_queries.JOB_COLUMNS`."""
        text = row["data"]
        return cls(
            id=row["id"],
            queue=row["queue"],
            state=row["state"],
            data=json.loads(text) if text is not None else None,
            priority=row["priority"],
            singleton_key=row["singleton_key"],
            attempt=row["attempt"],
            retry_count=row["retry_count"],
            retry_limit=row["retry_limit"],
            start_after=row["start_after"],
            created_at=row["created_at"],
            started_at=row["started_at"],
            completed_at=row["completed_at"],
            error=row["error"],
            data_bytes=len(text.encode()) if text is not None else 0,
        )

    def as_json(self, *, show_data: bool = True) -> dict[str, Any]:
        """The job as JSON; without ``show_data`` the data is ``{"redacted": true, "bytes": n}``."""
        return {
            "id": self.id,
            "queue": self.queue,
            "state": self.state,
            "data": self.data if show_data else {"redacted": True, "bytes": self.data_bytes},
            "priority": self.priority,
            "singleton_key": self.singleton_key,
            "attempt": self.attempt,
            "retry_count": self.retry_count,
            "retry_limit": self.retry_limit,
            "start_after": self.start_after.isoformat(),
            "created_at": self.created_at.isoformat(),
            "started_at": _iso(self.started_at),
            "completed_at": _iso(self.completed_at),
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of a job list, newest first; ``next`` is the cursor of the next page or None."""

    jobs: list[Job]
    next: str | None


@dataclass(frozen=True, slots=True)
class JobFilter:
    """The jobs a bulk action matches: one queue, optionally one state, created in
    ``[since, until)``. Only the states the action moves jobs out of ever match."""

    queue: str
    state: State | None = None
    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        _text("filter queue", self.queue)
        check_state(self.state)
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, datetime) or value.utcoffset() is None):
                raise InvalidArgument(f"filter {name} must be a timezone-aware datetime")

    def states(self, action: Action) -> list[str]:
        """The states this filter matches for ``action``."""
        allowed = ACTION_STATES[action]
        return [s for s in allowed if self.state is None or s == self.state]

    def as_json(self) -> dict[str, Any]:
        """The filter as the audit row records it."""
        return {
            "queue": self.queue,
            "state": self.state,
            "since": _iso(self.since),
            "until": _iso(self.until),
        }


@dataclass(frozen=True, slots=True)
class ActionResult:
    """What an action changed: how many jobs, and their ids (at most ``MAX_IDS_SHOWN`` for a
    filter action; none for a dry run)."""

    changed: int
    ids: list[int]
    #: Jobs the action matched but left alone to keep a key's promise (resume and retry only):
    #: an older job of a key that got its newest back, or one whose key already has a job in
    #: its place.
    skipped: int = 0


class KeyContention(SenderError):
    """A resume kept meeting a send of the same key that committed under it, or a retry or
    resume kept deadlocking with a transaction holding key locks in another order (each time
    the whole action was rolled back and run again); nothing changed, it may be run again."""

    def __init__(self, action: str) -> None:
        super().__init__(
            f"jobs.{action}: a job of the same key was sent meanwhile, {KEY_ATTEMPTS} times "
            "in a row; nothing changed, try again"
        )


class JobOps:
    """The job reads and actions of one queue schema as operations (written once, run by
    :class:`JobsApi` and :class:`SyncJobsApi`), each action recording ``actor``."""

    def __init__(self, schema: str, actor: Actor | None = None) -> None:
        self.schema = schema
        self.actor = actor or Actor()

    def get(self, job_id: int) -> Op[Job | None]:
        """The job with this id, or ``None``."""
        return one(q.GET_JOB, {"id": check_id(job_id)}, _job_or_none)

    def list(
        self,
        *,
        queue: str | None = None,
        state: State | None = None,
        key: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> Op[JobPage]:
        """One page of jobs, newest first (see :meth:`JobsApi.list`)."""
        check_state(state)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise InvalidArgument(f"limit must be an integer from 1 to {MAX_PAGE}")
        values: dict[str, Any] = {"limit": limit + 1}
        if queue is not None:
            values["queue"] = _text("queue", queue)
        if key is not None:
            values["key"] = _text("key", key)
        if after is not None:
            values["after"] = parse_cursor(after)
        query = q.list_jobs("queue" in values, state, "key" in values, "after" in values)

        def page(rows: Rows) -> JobPage:
            jobs = [Job.from_row(row) for row in rows[:limit]]
            return JobPage(jobs, str(jobs[-1].id) if len(rows) > limit else None)

        return one(query, values, page)

    def count_waiting(self, where: JobFilter) -> Op[int]:
        """How many created/retry jobs ``where`` matches (what ``queues.purge`` would delete)."""
        values = {
            "queue": where.queue,
            "states": [s for s in ("created", "retry") if where.state in (None, s)],
            "since": where.since,
            "until": where.until,
        }
        return one(q.COUNT_WHERE, values, _count)

    def act(self, action: Action, ids: Iterable[int]) -> Op[ActionResult]:
        """``action`` on these ids, with its audit row (resume and retry: see
        :func:`_keyed_action`)."""
        id_list = check_ids(ids)
        target = {"ids": id_list, "states": list(ACTION_STATES[action])}
        values = {**target, "shown": len(id_list), **self._actor_values()}
        keyed = _KEYED.get(action)
        if keyed is not None:
            return _keyed_action(action, keyed.lock_ids, keyed.act_ids, target, values)
        return one(_BY_IDS[action], values, _action_result, errors=denied(f"jobs.{action}"))

    def act_where(self, action: Action, where: JobFilter, *, dry_run: bool) -> Op[ActionResult]:
        """``action`` on every job ``where`` matches, or only their count (``dry_run``): the
        count of what the action would change now (and, for resume and retry, skip)."""
        target: dict[str, Any] = {
            "queue": where.queue,
            "states": where.states(action),
            "since": where.since,
            "until": where.until,
        }
        keyed = _KEYED.get(action)
        if dry_run:
            if keyed is not None:
                return one(keyed.count_where, target, lambda rows: _dry_run(action, rows))
            return one(q.COUNT_WHERE, target, lambda rows: ActionResult(_count(rows), []))
        values = {
            **target,
            "filter": json.dumps(where.as_json()),
            "shown": MAX_IDS_SHOWN,
            **self._actor_values(),
        }
        if keyed is not None:
            return _keyed_action(action, keyed.lock_where, keyed.act_where, target, values)
        return one(_WHERE[action], values, _action_result, errors=denied(f"jobs.{action}"))

    def _actor_values(self) -> dict[str, Any]:
        return {"actor_via": self.actor.via, "principal": self.actor.principal}


class JobsApi:
    """``sender.jobs``: reads and actions on the jobs of one queue schema."""

    def __init__(self, driver: AsyncDriver, *, actor: Actor | None = None) -> None:
        self._driver = driver
        self._ops = JobOps(driver.schema, actor)

    def as_actor(self, actor: Actor) -> JobsApi:
        """The same API recording ``actor`` in its audit rows."""
        return JobsApi(self._driver, actor=actor)

    async def get(self, job_id: int) -> Job | None:
        """The job with this id, or ``None``."""
        return await run_async(self._driver, self._ops.get(job_id))

    async def list(self, **filters: Unpack[ListFilters]) -> JobPage:
        """One page of jobs, newest first, filtered by ``queue``, ``state`` and ``key``, at
        most ``limit`` (100); pass the page's ``next`` as ``after`` for the following page."""
        return await run_async(self._driver, self._ops.list(**filters))

    async def retry(self, ids: Iterable[int]) -> IdList:
        """failed/cancelled jobs -> retry, due now, with one more attempt; the ids changed."""
        return (await self.act("retry", ids)).ids

    async def cancel(self, ids: Iterable[int]) -> IdList:
        """created/retry/active jobs -> cancelled; running ones are interrupted by their
        replica. Returns the ids changed."""
        return (await self.act("cancel", ids)).ids

    async def resume(self, ids: Iterable[int]) -> IdList:
        """cancelled jobs -> created; the ids changed."""
        return (await self.act("resume", ids)).ids

    async def delete(self, ids: Iterable[int]) -> IdList:
        """Delete jobs in any state (needs DELETE on the queue tables); the ids deleted."""
        return (await self.act("delete", ids)).ids

    async def retry_where(self, *, dry_run: bool = True, **filter_: Any) -> int:
        """:meth:`retry` every job matching the filter (see :class:`JobFilter`)."""
        return (await self.act_where("retry", JobFilter(**filter_), dry_run=dry_run)).changed

    async def cancel_where(self, *, dry_run: bool = True, **filter_: Any) -> int:
        """:meth:`cancel` every job matching the filter (see :class:`JobFilter`)."""
        return (await self.act_where("cancel", JobFilter(**filter_), dry_run=dry_run)).changed

    async def resume_where(self, *, dry_run: bool = True, **filter_: Any) -> int:
        """:meth:`resume` every job matching the filter (see :class:`JobFilter`)."""
        return (await self.act_where("resume", JobFilter(**filter_), dry_run=dry_run)).changed

    async def delete_where(self, *, dry_run: bool = True, **filter_: Any) -> int:
        """:meth:`delete` every job matching the filter (see :class:`JobFilter`)."""
        return (await self.act_where("delete", JobFilter(**filter_), dry_run=dry_run)).changed

    async def count_waiting(self, where: JobFilter) -> int:
        """How many created/retry jobs ``where`` matches (what ``queues.purge`` would delete)."""
        return await run_async(self._driver, self._ops.count_waiting(where))

    async def act(self, action: Action, ids: Iterable[int]) -> ActionResult:
        """Run ``action`` on these ids, with its audit row; ``skipped`` counts the jobs left
        alone to keep a key's promise (see the module docstring)."""
        return await self._run(lambda: self._ops.act(action, ids))

    async def act_where(self, action: Action, where: JobFilter, *, dry_run: bool) -> ActionResult:
        """Run ``action`` on every job ``where`` matches, or only count them (``dry_run``)."""
        return await self._run(lambda: self._ops.act_where(action, where, dry_run=dry_run))

    async def _run(self, make: Callable[[], Op[T]]) -> T:
        # A resume whose key got a job sent under it was rolled back whole: run it again, in a
        # new snapshot that sees that job (and so skips its key).
        for attempt in range(1, KEY_ATTEMPTS + 1):
            try:
                return await run_async(self._driver, make())
            except KeyContention:
                if attempt == KEY_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")


class SyncJobsApi:
    """``sync_sender.jobs``: :class:`JobsApi` for the synchronous sender, the same operations."""

    def __init__(self, driver: SyncDriver, *, actor: Actor | None = None) -> None:
        self._driver = driver
        self._ops = JobOps(driver.schema, actor)

    def as_actor(self, actor: Actor) -> SyncJobsApi:
        """The same API recording ``actor`` in its audit rows."""
        return SyncJobsApi(self._driver, actor=actor)

    def get(self, job_id: int) -> Job | None:
        """See :meth:`JobsApi.get`."""
        return run_sync(self._driver, self._ops.get(job_id))

    def list(self, **filters: Unpack[ListFilters]) -> JobPage:
        """See :meth:`JobsApi.list`."""
        return run_sync(self._driver, self._ops.list(**filters))

    def retry(self, ids: Iterable[int]) -> IdList:
        """See :meth:`JobsApi.retry`."""
        return self.act("retry", ids).ids

    def cancel(self, ids: Iterable[int]) -> IdList:
        """See :meth:`JobsApi.cancel`."""
        return self.act("cancel", ids).ids

    def resume(self, ids: Iterable[int]) -> IdList:
        """See :meth:`JobsApi.resume`."""
        return self.act("resume", ids).ids

    def delete(self, ids: Iterable[int]) -> IdList:
        """See :meth:`JobsApi.delete`."""
        return self.act("delete", ids).ids

    def retry_where(self, *, dry_run: bool = True, **filter_: Any) -> int:
        """See :meth:`JobsApi.retry_where`."""
        return self.act_where("retry", JobFilter(**filter_), dry_run=dry_run).changed

    def cancel_where(self, *, dry_run: bool = True, **filter_: Any) -> int:
        """See :meth:`JobsApi.cancel_where`."""
        return self.act_where("cancel", JobFilter(**filter_), dry_run=dry_run).changed

    def resume_where(self, *, dry_run: bool = True, **filter_: Any) -> int:
        """See :meth:`JobsApi.resume_where`."""
        return self.act_where("resume", JobFilter(**filter_), dry_run=dry_run).changed

    def delete_where(self, *, dry_run: bool = True, **filter_: Any) -> int:
        """See :meth:`JobsApi.delete_where`."""
        return self.act_where("delete", JobFilter(**filter_), dry_run=dry_run).changed

    def count_waiting(self, where: JobFilter) -> int:
        """See :meth:`JobsApi.count_waiting`."""
        return run_sync(self._driver, self._ops.count_waiting(where))

    def act(self, action: Action, ids: Iterable[int]) -> ActionResult:
        """See :meth:`JobsApi.act`."""
        return self._run(lambda: self._ops.act(action, ids))

    def act_where(self, action: Action, where: JobFilter, *, dry_run: bool) -> ActionResult:
        """See :meth:`JobsApi.act_where`."""
        return self._run(lambda: self._ops.act_where(action, where, dry_run=dry_run))

    def _run(self, make: Callable[[], Op[T]]) -> T:
        # See JobsApi._run.
        for attempt in range(1, KEY_ATTEMPTS + 1):
            try:
                return run_sync(self._driver, make())
            except KeyContention:
                if attempt == KEY_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")


class ListFilters(TypedDict, total=False):
    """The filters of ``jobs.list`` (see :meth:`JobOps.list`)."""

    queue: str | None
    state: State | None
    key: str | None
    limit: int
    after: str | None


def _job_or_none(rows: Rows) -> Job | None:
    return Job.from_row(rows[0]) if rows else None


def _count(rows: Rows) -> int:
    count: int = first(rows)["count"]
    return count


def _action_result(rows: Rows) -> ActionResult:
    row = first(rows)
    return ActionResult(int(row["changed"]), list(row["ids"]))


def _keyed_result(rows: Rows) -> ActionResult:
    row = first(rows)
    return ActionResult(int(row["changed"]), list(row["ids"]), int(row["skipped"]))


def _dry_run(action: Action, rows: Rows) -> ActionResult:
    row = first(rows)
    _check_locks(action, row["wanted"])
    return ActionResult(int(row["count"]), [], int(row["skipped"]))


def _check_locks(action: Action, wanted: int) -> None:
    """Refuse a resume or retry that would take more than MAX_KEY_LOCKS key locks (its dry
    run too: it counts what the action would do, and the action would refuse)."""
    if wanted > MAX_KEY_LOCKS:
        raise InvalidArgument(
            f"jobs.{action} would lock {wanted} keys at once, at most {MAX_KEY_LOCKS}: "
            "narrow the filter (since/until) or give fewer ids"
        )


def _keyed_action(
    action: Action,
    lock: Query,
    act: Query,
    target: Mapping[str, Any],
    values: Mapping[str, Any],
) -> Op[ActionResult]:
    """Resume or retry: two statements in one transaction (a savepoint inside the caller's),
    the locks first, then the change in a snapshot taken after them (api_sender.job_queries).
    The locks last to the end of that transaction."""

    def steps() -> Generator[Step, Rows, ActionResult]:
        yield Step(q.READ_COMMITTED, {})
        locked = first((yield Step(lock, {**target, "max_locks": MAX_KEY_LOCKS})))
        _check_locks(action, locked["wanted"])
        rows = yield Step(act, {**values, "locked": list(locked["locked"])})
        return _keyed_result(rows)

    return Op(steps(), atomic=True, errors=_keyed_errors(action))


def _keyed_errors(action: Action) -> ErrorMap:
    """The error map of resume and retry: a missing right is PermissionDenied; a unique
    violation (a send of the key committed under the resume's UPDATE) or a deadlock (with a
    caller's transaction holding key locks in another order) is KeyContention, run again."""
    rights = denied(f"jobs.{action}")

    def mapped(sqlstate: str, exc: BaseException) -> Exception | None:
        if sqlstate in ("23505", "40P01"):
            return KeyContention(action)
        if sqlstate == "25001":
            return InvalidArgument(
                f"jobs.{action} must run at READ COMMITTED (it reads each key again after locking"
                " it); the caller's transaction is at a stricter isolation level"
            )
        return rights(sqlstate, exc)

    return mapped


def denied(action: str) -> ErrorMap:
    """The error map of an action: a missing right (SQLSTATE 42501) is PermissionDenied."""

    def mapped(sqlstate: str, exc: BaseException) -> Exception | None:
        return PermissionDenied(action, str(exc)) if sqlstate == "42501" else None

    return mapped


_BY_IDS: dict[Action, Query] = {"cancel": q.CANCEL_IDS, "delete": q.DELETE_IDS}
_WHERE: dict[Action, Query] = {"cancel": q.CANCEL_WHERE, "delete": q.DELETE_WHERE}
#: The actions that put jobs back where a key may hold one (see job_queries.KeyedAction).
_KEYED: dict[Action, q.KeyedAction] = {"retry": q.RETRY, "resume": q.RESUME}


def check_state(state: Any) -> None:
    """Refuse anything but one of pg-boss's six state names (or ``None``)."""
    if state is not None and state not in STATES:
        raise InvalidArgument(f"state must be one of {', '.join(STATES)}")


def check_id(value: Any) -> int:
    """A job id: a positive integer that fits a bigint."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**63:
        raise InvalidArgument(f"job id must be a positive integer, not {str(value)[:40]!r}")
    return value


def check_ids(ids: Iterable[int]) -> IdList:
    """Job ids, at most 10,000 at once, each checked, duplicates dropped."""
    if isinstance(ids, str | bytes):
        raise InvalidArgument("ids must be a list of job ids, not a string")
    checked = sorted({check_id(value) for value in ids})
    if not checked:
        raise InvalidArgument("give at least one job id")
    if len(checked) > 10_000:
        raise InvalidArgument("at most 10,000 job ids at once; use a filter action for more")
    return checked


#: A job id or cursor as text: ASCII digits only (str.isdigit and int() take other scripts'
#: digits, superscripts, underscores, signs and spaces), at most a bigint's 19.
_DECIMAL = re.compile(r"[0-9]{1,19}")


def decimal_id(value: Any) -> int | None:
    """The positive bigint ``value`` spells in ASCII digits, else ``None``."""
    if isinstance(value, str) and _DECIMAL.fullmatch(value):
        number = int(value)
        if 0 < number < 2**63:
            return number
    return None


def parse_cursor(value: Any) -> int:
    """The id a page cursor stands for; InvalidArgument for anything else."""
    number = decimal_id(value)
    if number is None:
        raise InvalidArgument("after must be the next cursor of a previous page")
    return number


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value or "\x00" in value:
        raise InvalidArgument(f"{name} must be a non-empty string")
    return value


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def ids_of(values: Sequence[Any]) -> IdList:
    """Job ids given as text (CLI, forms): each a positive bigint in ASCII digits."""
    out = []
    for value in values:
        number = decimal_id(str(value))
        if number is None:
            raise InvalidArgument(
                f"job id must be a positive integer below 2^63, not {str(value)[:40]!r}"
            )
        out.append(number)
    return out
