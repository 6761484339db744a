"""Libraries' standard-library logging (asyncpg's pool) comes out as the daemon's own JSON
events, one line each, never a plain-text traceback (issue 13)."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys

import structlog


def test_asyncpg_pool_warnings_are_one_json_event_each() -> None:
    """The pool's "Failed to restore the pool connection floor" warning, logged with its
    exception by asyncpg in a real process, is one JSON line naming the logger and the error;
    records below warning stay out."""
    code = """
import logging, sys
from worker.logging import configure_logging
configure_logging("info", "json", sys.stdout)
try:
    raise ConnectionRefusedError(111, "Connect call failed")
except OSError:
    logging.getLogger("asyncpg.pool").warning(
        "Failed to restore the pool connection floor; retrying", exc_info=True)
logging.getLogger("asyncpg.pool").info("not shown")
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout
    event = json.loads(lines[0])
    assert event["event"] == "asyncpg.pool"
    assert event["level"] == "warning"
    assert event["message"].startswith("Failed to restore the pool connection floor")
    assert event["error"].startswith("ConnectionRefusedError")
    assert "Traceback" not in done.stdout


def test_the_stream_and_format_are_the_daemons() -> None:
    """Routed records go where structlog writes, in its format (console here)."""
    from worker.logging import configure_logging

    stream = io.StringIO()
    try:
        configure_logging("info", "console", stream)
        logging.getLogger("asyncpg.pool").error("pool closed")
        assert "asyncpg.pool" in stream.getvalue()
        assert "pool closed" in stream.getvalue()
    finally:
        structlog.reset_defaults()
        logging.basicConfig(level=logging.WARNING, force=True)
