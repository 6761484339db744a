"""The worker's peak RSS with the dependencies a production install has, and nothing else.

The development venv also holds the tools (import-linter brings ``rich`` and ``pygments``, which
structlog loads when it finds them): a worker started from it is a few MB larger than one from
``pip install .`` (the Docker image). This venv, ``benchmarks/.peers/chassis-production``, is
made once with ``pip install`` of this tree (its runtime dependencies only); the worker runs
this tree's code through PYTHONPATH, so the figure follows the code as it is now.
"""

from __future__ import annotations

import subprocess

from tests.support.processes import ROOT

from .drain import DrainResult, drain_once
from .peer import PEERS, make_venv

VENV = PEERS / "chassis-production"
PYTHON = VENV / "bin" / "python"
STAMP = VENV / ".installed"


def ensure_venv() -> str:
    """Create the production venv on first use (runtime dependencies only); its python."""
    make_venv(VENV)
    if not STAMP.exists():  # made now, or an install that did not finish
        subprocess.run(
            [str(PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             str(ROOT)],
            check=True,
        )  # fmt: skip
        STAMP.touch()
    return str(PYTHON)


async def production_drain() -> DrainResult:
    """The drain of :func:`benchmarks.drain.drain_once`, the worker on the production venv."""
    return await drain_once(python=ensure_venv())
