"""What the worker's imports cost in resident memory: ``python -m benchmarks.import_memory``.

Runs the production venv's interpreter (``benchmarks.production``: runtime dependencies only,
this tree's code through PYTHONPATH) once, importing the worker's stack in boot order and
printing ``VmRSS`` after each step, cumulative. Each step imports what the ones before did not,
so the added figure is that library's own share (pydantic-settings' includes pydantic's schema
builder, which pydantic loads only with the first model). One run on a shared machine: the
figures move by about 0.1 MB.
"""

from __future__ import annotations

import os
import subprocess

from tests.support.processes import ROOT

from .production import ensure_venv

#: The worker's imports in boot order (a step may name several modules, comma-separated).
STEPS = (
    "asyncio",
    "uvloop",
    "asyncpg",
    "anyio,structlog",
    "prometheus_client",
    "pydantic",
    "pydantic_settings",
    "croniter",
    "api_sender",
    # A worker process loads no Starlette or uvicorn (worker/http/probe_server.py).
    "worker.cli,worker.commands.daemon,worker.http.probe_server",
)

_PROBE = """
import importlib, sys

def rss():
    with open('/proc/self/status') as status:
        for line in status:
            if line.startswith('VmRSS'):
                return int(line.split()[1]) / 1024
    raise RuntimeError('no VmRSS')

last = rss()
print(f"{'the interpreter':70} {last:6.1f}")
for step in sys.argv[1:]:
    for name in step.split(','):
        importlib.import_module(name)
    now = rss()
    print(f"{step:70} {now:6.1f}  +{now - last:.1f}")
    last = now
"""


def main() -> None:
    """Print the table (MB, cumulative, then added by the step)."""
    python = ensure_venv()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([python, "-c", _PROBE, *STEPS], env=env, check=True)


if __name__ == "__main__":
    main()
