"""What every command shares with the CLI's entry point: the argument error, JSON output, and
the escaping of untrusted text in human output.

Kept apart from ``worker.cli`` so the commands never import the module that dispatches them.
"""

from __future__ import annotations

import json
import re
from typing import Any


class UsageError(Exception):
    """A bad command-line argument (exit 2, one line)."""


def print_json(value: Any) -> None:
    """Print ``value`` as one JSON document (json.dumps escapes every control character and
    everything past ASCII, so it is safe on a terminal as it is)."""
    print(json.dumps(value, indent=2, default=str))


#: What a terminal may act on rather than show: the C0 controls (ESC starts CSI and OSC
#: sequences: clear the screen, set the title, write the clipboard), DEL, the C1 controls
#: (U+009B is a one-character CSI on many terminals) and the bidirectional controls that make
#: text read other than it is stored (Trojan Source).
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: The same but newline and tab, for multi-line text.
_CONTROLS_IN_LINES = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def shown(text: object, *, lines: bool = False, json_text: bool = False) -> str:
    """``text`` (job data, error texts, keys: untrusted) for a terminal: every control
    character as a visible escape, ``\\x1b`` below U+0080 and ``\\u009b`` from there on (with
    ``json_text``, ``\\u001b`` throughout, which keeps JSON text valid JSON). With ``lines``,
    newlines and tabs stay as they are (a traceback keeps its shape); a carriage return never
    does, as it would let a line overwrite what came before it."""
    pattern = _CONTROLS_IN_LINES if lines else _CONTROLS

    def escape(match: re.Match[str]) -> str:
        code = ord(match[0])
        return f"\\x{code:02x}" if code < 0x80 and not json_text else f"\\u{code:04x}"

    return pattern.sub(escape, str(text))
