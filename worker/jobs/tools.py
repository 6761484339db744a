"""Tool jobs: the ``JobDeclaration`` lists named by ``TOOL_JOBS``."""

from __future__ import annotations

import importlib

from ..declarations import JobDeclaration
from ..queue.jobs import ClaimedJob
from ..queue.poller import Consumer
from ..settings import ConfigError
from .spec import InstalledJob, JobContext


def load_declarations(paths: list[str]) -> list[JobDeclaration]:
    """Import every ``module:attribute`` path; raise :class:`ConfigError` naming a bad one."""
    declarations: list[JobDeclaration] = []
    for path in paths:
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
        declarations.extend(value)
    seen: set[str] = set()
    for declaration in declarations:
        if declaration.queue in seen:
            raise ConfigError(
                f"invalid configuration: TOOL_JOBS: queue {declaration.queue!r} is declared twice"
            )
        seen.add(declaration.queue)
    return declarations


def tool_job(declaration: JobDeclaration) -> InstalledJob:
    """The install entry and consumer of one declaration."""
    schedule = declaration.schedule
    cron = schedule.cron if schedule is not None and schedule.enabled else None

    def make_consumer(_: JobContext) -> Consumer:
        async def run_job(job: ClaimedJob) -> object:
            return await declaration.handler(job.data, job.info())

        return Consumer(
            queue=declaration.queue,
            batch_size=declaration.batch_size,
            concurrency=declaration.concurrency,
            run_job=run_job,
            one_per_key=declaration.options.policy in ("singleton", "stately"),
        )

    return InstalledJob(declaration.queue, declaration.options, cron, make_consumer)
