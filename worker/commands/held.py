"""``chassis-worker held``: operator tools for held usage events (issue 4)."""

from __future__ import annotations

import argparse
from typing import Any

from ..settings import Settings


def add_held_parser(sub: Any) -> None:
    """Register ``held list|redrive|discard``."""
    held = sub.add_parser("held", help="held usage events: list, redrive, discard")
    actions = held.add_subparsers(dest="held_action", required=True)
    listing = actions.add_parser("list", help="list held events")
    listing.add_argument("--json", action="store_true")
    redrive = actions.add_parser("redrive", help="send held events back now")
    redrive.add_argument("ids", nargs="*")
    redrive.add_argument("--all", action="store_true")
    discard = actions.add_parser("discard", help="drop held events (writes an audit row)")
    discard.add_argument("ids", nargs="+")
    discard.add_argument("--yes", action="store_true")


async def held_command(settings: Settings, args: argparse.Namespace) -> int:
    """Dispatch the held subcommands."""
    raise NotImplementedError("held commands are not implemented yet")
