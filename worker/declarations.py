"""What a user declares: tool jobs, their schedule and queue options, and what a handler gets."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, PydanticUndefinedAnnotation, PydanticUserError

from .settings import cron_fields

Policy = Literal["standard", "short", "singleton", "stately"]

#: Policies that allow one queued job per key. A dead-letter copy has no key, so a dead letter
#: of such a policy would keep one copy and drop the others: the install refuses one.
ONE_QUEUED_PER_KEY: tuple[Policy, ...] = ("short", "stately")


def dead_letter_refusal(queue: str, dead_letter: str, policy: str, where: str) -> str:
    """The one-line refusal of ``queue``'s dead letter, whose ``policy`` would drop copies."""
    return (
        f"invalid configuration: {where}queue {queue!r} has dead letter {dead_letter!r} of "
        f"policy {policy!r}: dead-letter copies carry no key, so a short or stately dead letter "
        "would keep one of them and drop the others; give it policy standard or singleton"
    )


@dataclass(frozen=True, slots=True)
class JobInfo:
    """What a handler learns about the job it runs, besides its data."""

    #: The job's id.
    id: int
    #: The queue it came from.
    queue: str
    #: The timer key or singleton key it was sent with, else ``None``.
    key: str | None
    #: Which claim of this job this run is (1 on the first run).
    attempt: int = 1
    #: Failed attempts before this one.
    retry_count: int = 0


# The runner builds one JobInfo per job. A frozen dataclass's __init__ sets each field through
# object.__setattr__ (1.9 µs for five, by keyword); setting the slots through their descriptors
# is the same assignment at under half the cost, with no other effect (JobInfo has no
# __post_init__ and no default factory).
_new_info = object.__new__
_set_id, _set_queue, _set_key, _set_attempt, _set_retry_count = (
    JobInfo.__dict__[name].__set__ for name in ("id", "queue", "key", "attempt", "retry_count")
)


def job_info(job_id: int, queue: str, key: str | None, attempt: int, retry_count: int) -> JobInfo:
    """``JobInfo(job_id, queue, key, attempt, retry_count)``, built for the per-job path."""
    info: JobInfo = _new_info(JobInfo)
    _set_id(info, job_id)
    _set_queue(info, queue)
    _set_key(info, key)
    _set_attempt(info, attempt)
    _set_retry_count(info, retry_count)
    return info


#: A handler: called once per job with that job's data (``None`` for a cron run; an instance of
#: the declaration's ``payload`` model when it has one) and its info.
Handler = Callable[[Any, JobInfo], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class Schedule:
    """A cron for a queue: 5 fields, or 6 with seconds first. ``enabled=False`` unschedules."""

    cron: str
    enabled: bool = True

    def __post_init__(self) -> None:
        cron_fields(self.cron)


@dataclass(frozen=True, slots=True)
class QueueOptions:
    """A queue's policy, retry budget, expiry, retention and dead letter (pg-boss's options)."""

    policy: Policy = "standard"
    retry_limit: int = 2
    retry_delay: int = 0
    retry_backoff: bool = False
    expire_seconds: int = 900
    retention_seconds: int = 3600
    failed_retention_seconds: int = 7 * 24 * 3600
    dead_letter: str | None = None

    def __post_init__(self) -> None:
        if self.policy not in ("standard", "short", "singleton", "stately"):
            raise ValueError(f"unknown queue policy {self.policy!r}")
        for name in ("retry_limit", "retry_delay", "retention_seconds", "failed_retention_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.expire_seconds <= 0:
            raise ValueError("expire_seconds must be positive")


@dataclass(frozen=True, slots=True)
class JobDeclaration:
    """A tool's job: its queue, its handler and, optionally, a cron schedule.

    ``batch_size`` is how many jobs one fetch claims, ``concurrency`` how many handlers of this
    queue run at once in one process. A handler that raises fails that job only.

    ``payload``, a pydantic model, types the data: the handler receives a ``payload`` instance,
    validated in JSON mode (``send(queue, model)`` writes ``model.model_dump(mode="json")``; a
    model with aliases must also accept its field names to read that back). A job without data,
    every cron run among them, still hands the handler ``None``. Data that does not validate can
    never succeed: the job fails at once, with no retry, to its dead letter, logged
    ``job.payload_invalid``; its error names each failing location and what was wrong, never
    the data (the console shows errors where it hides data).
    """

    queue: str
    handler: Handler
    schedule: Schedule | None = None
    batch_size: int = 1
    concurrency: int = 1
    options: QueueOptions = field(default_factory=QueueOptions)
    payload: type[BaseModel] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.queue, str) or not self.queue:
            raise ValueError("JobDeclaration.queue must be a non-empty string")
        if not callable(self.handler):
            raise ValueError(f"JobDeclaration({self.queue!r}).handler must be callable")
        if not 1 <= self.batch_size <= 1000:
            raise ValueError(f"JobDeclaration({self.queue!r}).batch_size must be 1..1000")
        if not 1 <= self.concurrency <= 1000:
            raise ValueError(f"JobDeclaration({self.queue!r}).concurrency must be 1..1000")
        if self.payload is not None:
            _check_payload(self.queue, self.payload)


def _check_payload(queue: str, payload: object) -> None:
    """A payload is a pydantic model class whose schema is complete (every forward reference
    resolved), so no job ever fails for the declaration's sake."""
    if not (isinstance(payload, type) and issubclass(payload, BaseModel)):
        raise ValueError(
            f"JobDeclaration({queue!r}).payload must be a pydantic model class (a BaseModel "
            f"subclass), not {payload!r}"
        )
    if not payload.__pydantic_complete__:
        try:
            payload.model_rebuild(raise_errors=True)
        except (PydanticUndefinedAnnotation, PydanticUserError) as exc:
            raise ValueError(
                f"JobDeclaration({queue!r}).payload {payload.__name__} is not fully defined: "
                f"{exc.message}"
            ) from None
