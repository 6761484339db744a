"""Tool jobs the deploy test mounts into the image (``TOOL_JOBS=deploy_jobs:JOBS``).

``deploy-sleep`` runs as long as its job's data says (``{"seconds": 600}``), so a stopping worker
meets a job that is still running.
"""

from __future__ import annotations

import asyncio
from typing import Any

from worker import JobDeclaration, JobInfo


async def sleep(data: Any, job: JobInfo) -> None:
    """Sleep for ``data["seconds"]``."""
    await asyncio.sleep(float(data.get("seconds", 0)))


JOBS = [JobDeclaration(queue="deploy-sleep", handler=sleep)]
