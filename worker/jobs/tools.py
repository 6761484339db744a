"""Tool jobs: the ``JobDeclaration`` lists named by ``TOOL_JOBS``."""

from __future__ import annotations

import importlib

import structlog
from pydantic import BaseModel, ValidationError

from ..declarations import ONE_QUEUED_PER_KEY, JobDeclaration, Policy, dead_letter_refusal
from ..queue.jobs import ClaimedJob, FinalFailure
from ..queue.poller import Consumer
from ..settings import ConfigError
from .chassis import CHASSIS_QUEUES
from .payload import describe, validate
from .spec import InstalledJob, JobContext

log = structlog.get_logger("worker.jobs")


def load_declarations(paths: list[str]) -> list[JobDeclaration]:
    """Import every ``module:attribute`` path; raise :class:`ConfigError` naming a bad one.

    Refused before anything is installed: a path that does not import or is not a list of
    ``JobDeclaration``, a queue declared twice, a chassis queue redeclared, a queue that is its
    own dead letter, and a dead letter declared here with a policy that keeps one queued job
    per key (see :data:`ONE_QUEUED_PER_KEY`).
    """
    loaded: list[tuple[str, JobDeclaration]] = []
    for path in paths:
        loaded.extend((path, declaration) for declaration in _import_list(path))
    _check(loaded)
    return [declaration for _, declaration in loaded]


def _import_list(path: str) -> list[JobDeclaration]:
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(
            f"invalid configuration: TOOL_JOBS: cannot import {module_name!r} from {path!r}: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    try:
        value = getattr(module, attribute)
    except AttributeError:
        raise ConfigError(
            f"invalid configuration: TOOL_JOBS: {module_name!r} has no attribute "
            f"{attribute!r} ({path!r})"
        ) from None
    if not isinstance(value, list | tuple) or not all(
        isinstance(item, JobDeclaration) for item in value
    ):
        raise ConfigError(
            f"invalid configuration: TOOL_JOBS: {path!r} is not a list of JobDeclaration"
        )
    return list(value)


def _check(loaded: list[tuple[str, JobDeclaration]]) -> None:
    policies: dict[str, Policy] = {}
    for path, declaration in loaded:
        queue = declaration.queue
        if queue in CHASSIS_QUEUES:
            raise ConfigError(
                f"invalid configuration: TOOL_JOBS: {path!r} declares queue {queue!r}, a chassis "
                f"queue (the chassis installs {', '.join(CHASSIS_QUEUES)} itself); give the tool "
                "queue another name"
            )
        if queue in policies:
            raise ConfigError(
                f"invalid configuration: TOOL_JOBS: queue {queue!r} is declared twice "
                f"(again in {path!r})"
            )
        policies[queue] = declaration.options.policy
    for path, declaration in loaded:
        queue, dead_letter = declaration.queue, declaration.options.dead_letter
        if dead_letter is None:
            continue
        if dead_letter == queue:
            raise ConfigError(
                f"invalid configuration: TOOL_JOBS: {path!r} declares queue {queue!r} as its own "
                "dead letter (each exhausted job would be copied back into it, forever)"
            )
        # A dead letter declared elsewhere (another deployment) is checked by the install.
        policy = policies.get(dead_letter)
        if policy is not None and policy in ONE_QUEUED_PER_KEY:
            where = f"TOOL_JOBS: {path!r}: "
            raise ConfigError(dead_letter_refusal(queue, dead_letter, policy, where))


def tool_job(declaration: JobDeclaration) -> InstalledJob:
    """The install entry and consumer of one declaration."""
    schedule = declaration.schedule
    cron = schedule.cron if schedule is not None and schedule.enabled else None
    model = declaration.payload

    def make_consumer(_: JobContext) -> Consumer:
        async def run_job(job: ClaimedJob) -> object:
            data = job.data if model is None else typed_data(model, job)
            return await declaration.handler(data, job.info())

        return Consumer(
            queue=declaration.queue,
            batch_size=declaration.batch_size,
            concurrency=declaration.concurrency,
            run_job=run_job,
            one_per_key=declaration.options.policy in ("singleton", "stately"),
        )

    return InstalledJob(declaration.queue, declaration.options, cron, make_consumer)


def typed_data(model: type[BaseModel], job: ClaimedJob) -> BaseModel | None:
    """``job``'s data as a ``model`` (``None`` stays ``None``). Data that does not validate can
    never succeed: logged ``job.payload_invalid`` and raised as :class:`FinalFailure`, which
    fails the job at once to its dead letter, the error told without the data."""
    try:
        return validate(model, job.raw_data)
    except ValidationError as exc:
        assert job.raw_data is not None
        error = describe(exc, model, job.raw_data)
    log.warning(
        "job.payload_invalid",
        job_id=job.id,
        queue=job.queue,
        attempt=job.attempt,
        model=model.__name__,
        error=error[:500],
    )
    # Not chained: the ValidationError quotes the input.
    raise FinalFailure(error)
