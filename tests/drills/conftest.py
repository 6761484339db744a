"""Fixtures of the fault drills: the size they run at, the daemons they start, the ledger, and
the one summary line each drill records (printed together at the end of the run)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.drills.helpers import SCALE, Fleet

#: (outcome, nodeid, line, seconds) of every drill that ran in this process or an xdist worker.
_LINES: list[tuple[str, str, str, float]] = []
_KEY = "drill_summary"


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker of the drill that restarts the shared server."""
    config.addinivalue_line(
        "markers", "server_restart: restarts the shared PostgreSQL server (not in make test)"
    )


@pytest.fixture
def drill_report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Record this drill's one summary line (the fault, what happened, nothing lost)."""

    def record(line: str) -> None:
        request.node.user_properties.append((_KEY, line))

    return record


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    """Daemons a drill starts; every one still running is SIGKILLed afterwards."""
    daemons = Fleet(tmp_path)
    try:
        yield daemons
    finally:
        daemons.kill_all()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collect each drill's line (user properties travel from xdist workers too)."""
    if "drill" not in report.keywords:
        return
    if report.when == "setup" and report.failed:
        reason = str(report.longrepr).strip().splitlines()[-1] if report.longrepr else ""
        _LINES.append(("ERROR", report.nodeid, f"set-up failed: {reason[:300]}", 0.0))
        return
    if report.when != "call":
        return
    lines = [str(value) for key, value in report.user_properties if key == _KEY]
    if report.passed:
        outcome = "ok"
        text = lines[-1] if lines else "(no summary line recorded)"
    else:
        outcome = "FAILED" if report.failed else report.outcome
        reason = str(report.longrepr).strip().splitlines()[-1] if report.longrepr else ""
        text = (lines[-1] + " | " if lines else "") + reason[:300]
    _LINES.append((outcome, report.nodeid, text, report.duration))


def _number(line: tuple[str, str, str, float]) -> tuple[int, str]:
    """Order lines by their drill number (RELIABILITY.md's table), unnumbered last."""
    match = re.match(r"drill (\d+)", line[2])
    return (int(match[1]) if match else 1000, line[1])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line per drill, in the order they ran."""
    if not _LINES:
        return
    terminalreporter.section(f"fault drills (DRILL_SCALE={SCALE})")
    for outcome, nodeid, text, seconds in sorted(_LINES, key=_number):
        where = "" if outcome == "ok" else f"{nodeid}: "
        terminalreporter.write_line(f"{outcome:6} {seconds:5.0f}s  {where}{text}")
    total = sum(seconds for *_, seconds in _LINES)
    failed = sum(1 for outcome, *_ in _LINES if outcome != "ok")
    terminalreporter.write_line(f"{len(_LINES)} drills, {failed} failed, {total:.0f}s in drills")
