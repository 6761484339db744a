"""Every queue the worker installs, in install order, with its schedule and consumer."""

from __future__ import annotations

from ..declarations import JobDeclaration
from ..settings import Settings
from . import purges, usage
from .spec import InstalledJob
from .tools import tool_job


def installed_jobs(settings: Settings, tools: list[JobDeclaration]) -> list[InstalledJob]:
    """The install order: the held queue before the usage queue that names it as dead letter,
    then the nightly purges, the tool queues in declaration order, and the orphan-user purge."""
    return [
        *usage.usage_jobs(settings),
        purges.audit_purge(settings),
        purges.apikey_expiry_sweep(settings),
        purges.idempotency_purge(settings),
        *(tool_job(declaration) for declaration in tools),
        purges.orphan_user_purge(settings),
    ]
