"""Cleaning up after tests that boot the embedded PostgreSQL under a temporary data directory."""

from __future__ import annotations

import contextlib
from pathlib import Path

import psutil


def stop_embedded(data_dir: Path, timeout: float = 15.0) -> None:
    """End every process (initdb, the postmaster) still working on ``data_dir``.

    A CLI stopped while the embedded server was being set up leaves initdb (or a started
    postmaster) running on its own; the test's temporary directory is about to go.
    """
    marker = str(data_dir.resolve())
    found: list[psutil.Process] = []
    for process in psutil.process_iter(attrs=["cmdline"]):
        cmdline = process.info.get("cmdline") or []
        if any(marker in part for part in cmdline):
            found.append(process)
    for process in found:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, alive = psutil.wait_procs(found, timeout=timeout)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
