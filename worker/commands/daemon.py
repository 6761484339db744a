"""run and migrate: the daemon, and its install section alone."""

from __future__ import annotations

import argparse

import anyio

from ..boot import database_url, run, session_url
from ..install import install
from ..jobs.registry import installed_jobs
from ..jobs.tools import load_declarations
from ..settings import Settings
from .failures import reaching
from .output import UsageError


async def run_command(settings: Settings, _: argparse.Namespace) -> int:
    """``chassis-worker run``."""
    tools = load_declarations(settings.tool_job_paths) if settings.is_worker else []
    return await run(settings, tools)


async def migrate_command(settings: Settings, args: argparse.Namespace) -> int:
    """``chassis-worker migrate [--wait SECONDS]``: the worker's install section, then exit.

    A database that is not up yet is waited for, ``--wait`` seconds at most (a server still
    starting next to a one-shot migrate), then reported as unreachable (exit 1).
    """
    if not 0 <= args.wait <= 86_400:
        raise UsageError("invalid --wait: give 0 to 86400 seconds")
    tools = load_declarations(settings.tool_job_paths)
    url = session_url(settings, await database_url(settings))
    async with reaching(url):
        await install(
            url,
            settings.jobs_schema,
            installed_jobs(settings, tools),
            cron_tz=settings.cron_tz,
            lock_timeout=settings.install_lock_timeout_seconds,
            connect_deadline=anyio.current_time() + args.wait,
        )
    print("migrated")
    return 0
