"""System tools a test needs (promtool, docker, debootstrap, ...).

Under ``CI=true`` a missing one fails the test: CI installs them (.ci/run), so a test of a real
component must run there, never skip. Elsewhere the test skips with the install hint.
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

#: Searched after PATH: Debian's own binary directories (a non-root PATH may lack the sbin ones).
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` set to true, as CI services and .ci/run set it)."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def unavailable(reason: str) -> NoReturn:
    """Fail the test under CI, else skip it, saying what is missing and how to get it."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: this test must run, not skip)", pytrace=False)
    pytest.skip(reason)


def find_tool(name: str) -> str | None:
    """The path of the executable ``name`` on PATH or in the system directories, or None."""
    return shutil.which(name) or shutil.which(name, path=SYSTEM_PATH)


def require_tool(name: str, apt_package: str, *, hint: str = "") -> str:
    """The path of the executable ``name``; missing, :func:`unavailable` with the apt command."""
    path = find_tool(name)
    if path is None:
        unavailable(
            f"{name} is not installed: `apt-get install {apt_package}` (Debian/Ubuntu)"
            + (f", {hint}" if hint else "")
        )
    return path
