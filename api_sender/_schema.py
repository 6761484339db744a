"""Validated SQL identifiers: the queue schema is the one name we interpolate into SQL."""

from __future__ import annotations

import re

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

#: NOTIFY channel prefix; the schema is appended so two installs in one database stay apart.
CHANNEL_PREFIX = "chassis_jobs_"


def check_schema_name(name: str) -> str:
    """Return ``name`` if it is a safe lower-case SQL identifier, else raise ``ValueError``."""
    if not _IDENTIFIER.fullmatch(name):
        raise ValueError(
            f"invalid schema name {name!r}: use 1-63 characters of a-z, 0-9 and _, "
            "not starting with a digit"
        )
    return name


def quoted(name: str) -> str:
    """Return the schema name double-quoted for SQL, after validating it."""
    return '"' + check_schema_name(name) + '"'


def notify_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel that announces new due jobs in ``schema``."""
    return CHANNEL_PREFIX + check_schema_name(schema)


#: Channel prefix of interrupt requests for running jobs (cancel, delete), one per schema.
CANCEL_CHANNEL_PREFIX = "chassis_cancel_"


def cancel_channel(schema: str) -> str:
    """The channel on which ``<owner> <id>,<id>...`` asks a replica to interrupt those jobs."""
    return CANCEL_CHANNEL_PREFIX + check_schema_name(schema)
