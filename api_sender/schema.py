"""Validated SQL identifiers: the queue schema is the one name we interpolate into SQL."""

from __future__ import annotations

import re

#: NOTIFY channel prefix; the schema is appended so two installs in one database stay apart.
CHANNEL_PREFIX = "chassis_jobs_"
#: The channel an install notifies when schedules changed (read by running schedulers).
SCHEDULES_CHANNEL_PREFIX = "chassis_schedules_"
#: The channel on which job actions ask a replica to interrupt running jobs (cancel, delete).
CANCEL_CHANNEL_PREFIX = "chassis_cancel_"

#: PostgreSQL truncates identifiers (channel names included) past 63 bytes (NAMEDATALEN - 1).
MAX_IDENTIFIER_BYTES = 63
#: Every identifier built from the schema name is ``<prefix><schema>``; the longest prefix
#: decides how long a schema name may be so that each of them still fits.
DERIVED_PREFIXES = (CHANNEL_PREFIX, SCHEDULES_CHANNEL_PREFIX, CANCEL_CHANNEL_PREFIX)
MAX_SCHEMA_LENGTH = MAX_IDENTIFIER_BYTES - max(len(p) for p in DERIVED_PREFIXES)

_IDENTIFIER = re.compile(rf"^[a-z_][a-z0-9_]{{0,{MAX_SCHEMA_LENGTH - 1}}}$")


def check_schema_name(name: str) -> str:
    """Return ``name`` if it is a safe lower-case SQL identifier, else raise ``ValueError``."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise ValueError(
            f"invalid schema name {name!r}: use 1-{MAX_SCHEMA_LENGTH} characters of a-z, 0-9 "
            f"and _, not starting with a digit (the NOTIFY channel {SCHEDULES_CHANNEL_PREFIX}"
            f"<schema> must fit in {MAX_IDENTIFIER_BYTES} bytes)"
        )
    if name.startswith("pg_"):
        raise ValueError(f"invalid schema name {name!r}: PostgreSQL reserves names starting pg_")
    return name


def quoted(name: str) -> str:
    """Return the schema name double-quoted for SQL, after validating it."""
    return '"' + check_schema_name(name) + '"'


def notify_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel that announces new due jobs in ``schema``."""
    return CHANNEL_PREFIX + check_schema_name(schema)


def schedules_channel(schema: str) -> str:
    """The NOTIFY channel announcing schedule changes in ``schema``."""
    return SCHEDULES_CHANNEL_PREFIX + check_schema_name(schema)


def cancel_channel(schema: str) -> str:
    """The channel on which ``<owner> <id>,<id>...`` asks a replica to interrupt those jobs."""
    return CANCEL_CHANNEL_PREFIX + check_schema_name(schema)
