"""Every command but run logs to stderr: stdout carries only the command's output."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.embedded import stop_embedded
from tests.support.processes import run_cli


def test_migrate_prints_only_its_result_on_stdout(empty_db_url: str, tmp_path: Path) -> None:
    """migrate's log lines (install.started, migrate.applied, ...) go to stderr, not stdout."""
    result = run_cli(empty_db_url, "migrate", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["migrated"]
    events = [json.loads(line)["event"] for line in result.stderr.splitlines()]
    assert "install.done" in events


def test_held_redrive_prints_only_its_result_on_stdout(db_url: str, tmp_path: Path) -> None:
    """held redrive logs held.redriven on stderr; stdout is the summary line alone."""
    assert run_cli(db_url, "migrate", cwd=tmp_path).returncode == 0
    result = run_cli(db_url, "held", "redrive", "--all", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["redriven 0 event(s), due now"]
    assert "held.redriven" in result.stderr


@pytest.mark.slow
@pytest.mark.xdist_group("embedded")
def test_queues_json_on_the_embedded_server_is_pure_json(tmp_path: Path) -> None:
    """DATABASE_URL unset: `queues --json` stdout parses as JSON and stderr carries no warning
    (the first run initialises the embedded server, so this test is slow)."""
    data = tmp_path / "pg"
    # As on a container or CI runner: no XDG_RUNTIME_DIR (platformdirs warned about it).
    env = {"EMBEDDED_DATA_DIR": str(data)}
    saved = os.environ.pop("XDG_RUNTIME_DIR", None)
    try:
        migrated = run_cli(None, "migrate", env=env, cwd=tmp_path, timeout=180)
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        result = run_cli(None, "queues", "--json", env=env, cwd=tmp_path, timeout=120)
    finally:
        if saved is not None:
            os.environ["XDG_RUNTIME_DIR"] = saved
        stop_embedded(data)
    assert result.returncode == 0, result.stdout + result.stderr
    names = {queue["name"] for queue in json.loads(result.stdout)["queues"]}
    assert "usage-events" in names
    for output in (migrated.stderr, result.stderr):
        assert "Warning" not in output, output
        assert all(json.loads(line)["level"] != "warning" for line in output.splitlines())
