"""What every command shares with the CLI's entry point: the argument error and JSON output.

Kept apart from ``worker.cli`` so the commands never import the module that dispatches them.
"""

from __future__ import annotations

import json
from typing import Any


class UsageError(Exception):
    """A bad command-line argument (exit 2, one line)."""


def print_json(value: Any) -> None:
    """Print ``value`` as one JSON document."""
    print(json.dumps(value, indent=2, default=str))
