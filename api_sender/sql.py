"""Named SQL statements of the producer side, rendered once per queue schema.

Every statement takes the data as JSON text (``$n::text::jsonb``) and returns ids and JSON as
plain values, so they work on any asyncpg pool whatever type codecs its owner installed. The
SQL functions they call raise SQLSTATE P0002 for an unknown queue and 22023 for an invalid
argument; :func:`api_sender.errors.sender_error` maps those to the producer's exceptions.
"""

from __future__ import annotations

from dataclasses import dataclass

from .schema import quoted

# The SQL functions of migration 0007 are the one definition of a send (contract section 11):
# these statements only call them, binding the arguments the Python options validated. The
# parameters keep one order for send and send_many ($3..$10: SendOptions.args()). A delay is
# seconds from the database's now(); make_interval of NULL is NULL ("no delay").
_OPTIONS = """
    priority => $3::int, singleton_key => $4::text,
    start_after => make_interval(secs => $5::float8), start_at => $6::timestamptz,
    retry_limit => $7::int, retry_delay => $8::int, retry_backoff => $9::bool,
    expire_in_seconds => $10::int"""

_SEND = """
-- send: one job; its id, or NULL when the queue's policy refuses the key (jobs.send).
SELECT {s}.send($1, $2::text::jsonb, {options}) AS id
"""

_SEND_MANY = """
-- send_many: many jobs of one queue in one statement, all or nothing (jobs.send_many); $11
-- optionally gives each item its own singleton key.
SELECT {s}.send_many($1, $2::text[]::jsonb[], {options}, singleton_keys => $11::text[]) AS ids
"""

_CANCEL_TIMER = """
-- timers.cancel: true when the timer of (queue, key) was pending (jobs.cancel_timer).
SELECT {s}.cancel_timer($1, $2) AS cancelled
"""

_SEND_TIMER = """
-- timers.schedule: a timer due at an instant or after a delay (database clock); a key replaces
-- the pending timer of that key, under a lock held to the end of the transaction
-- (jobs.schedule_timer).
SELECT {s}.schedule_timer(
    $1, at => COALESCE($4::timestamptz, now() + make_interval(secs => COALESCE($5::float8, 0))),
    data => $2::text::jsonb, key => $3::text) AS id
"""


@dataclass(frozen=True, slots=True)
class SenderStatements:
    """The producer's statements for one schema."""

    send: str
    send_many: str
    cancel_timer: str
    send_timer: str


def render(schema: str) -> SenderStatements:
    """Render every producer statement for ``schema`` (validated and quoted)."""
    values = {"s": quoted(schema), "options": _OPTIONS}
    return SenderStatements(
        send=_SEND.format(**values),
        send_many=_SEND_MANY.format(**values),
        cancel_timer=_CANCEL_TIMER.format(**values),
        send_timer=_SEND_TIMER.format(**values),
    )
