"""Named SQL statements of the producer side (the :class:`~api_sender.query.Query` convention).

The SQL functions of migration 0007 are the one definition of a send (contract section 11):
these statements only call them, binding by name what the Python options validated, so a job
sent from Python, from ``psql`` or from any other language is made by the same code. Every
statement takes the data as JSON text (``:data::text::jsonb``) and returns ids as plain values,
so they work on any driver (asyncpg, psycopg 3, SQLAlchemy, Django) whatever type codecs its
owner installed. The functions raise SQLSTATE P0002 for an unknown queue and 22023 for an
invalid argument; :func:`api_sender.errors.sender_error` maps those to the producer's
exceptions (on every driver: :class:`~api_sender.operation.Op`'s error map).
"""

from __future__ import annotations

from .query import Query

#: The options send and send_many share (``SendOptions.values()``). A delay is seconds from the
#: database's now(); make_interval of NULL is NULL ("no delay").
_OPTIONS = """
    priority => :priority::int, singleton_key => :singleton_key::text,
    start_after => make_interval(secs => :delay::float8), start_at => :at::timestamptz,
    retry_limit => :retry_limit::int, retry_delay => :retry_delay::int,
    retry_backoff => :retry_backoff::bool, expire_in_seconds => :expire_seconds::int"""

#: Whether the queue exists, looked up before the function is called: an unknown queue is then
#: reported without an error raised in the database, so it never aborts the caller's own
#: transaction (``connection=``). CASE calls the (volatile) function only for a found queue.
_FOUND = "(SELECT EXISTS (SELECT 1 FROM {s}.queue WHERE name = :queue) AS queue_found) q"

SEND = Query(
    "send",
    f"""
-- send: one job; its id, or NULL when the queue's policy refuses the key (jobs.send).
SELECT CASE WHEN q.queue_found THEN {{s}}.send(:queue, :data::text::jsonb, {_OPTIONS}) END AS id,
       q.queue_found
FROM {_FOUND}
""",
)

#: send for a connection in no transaction of the caller's (a sender's own pool or autocommit
#: connection): no lookup first, as an unknown queue's P0002 then aborts nothing but this
#: statement (the error map makes it QueueNotFound). One lookup fewer per send.
SEND_ALONE = Query(
    "send_alone",
    f"""
-- send, alone in its transaction: one job; its id, or NULL when the policy refuses the key.
SELECT {{s}}.send(:queue, :data::text::jsonb, {_OPTIONS}) AS id, true AS queue_found
""",
)

SEND_MANY = Query(
    "send_many",
    f"""
-- send_many: many jobs of one queue in one statement, all or nothing (jobs.send_many); keys
-- optionally gives each item its own singleton key.
SELECT CASE WHEN q.queue_found THEN {{s}}.send_many(:queue, :items::text[]::jsonb[], {_OPTIONS},
                                                  singleton_keys => :keys::text[]) END AS ids,
       q.queue_found
FROM {_FOUND}
""",
)

SEND_MANY_ALONE = Query(
    "send_many_alone",
    f"""
-- send_many, alone in its transaction (see SEND_ALONE).
SELECT {{s}}.send_many(:queue, :items::text[]::jsonb[], {_OPTIONS},
                       singleton_keys => :keys::text[]) AS ids, true AS queue_found
""",
)

CANCEL_TIMER = Query(
    "cancel_timer",
    f"""
-- timers.cancel: true when the timer of (queue, key) was pending or running (jobs.cancel_timer);
-- false for an unknown queue, which has no timer (the function would raise P0002).
SELECT CASE WHEN q.queue_found THEN {{s}}.cancel_timer(:queue, :key) ELSE false END AS cancelled,
       q.queue_found
FROM {_FOUND}
""",
)

SEND_TIMER = Query(
    "send_timer",
    f"""
-- timers.schedule: a timer due at an instant or after a delay (database clock); a key replaces
-- the unfinished timer of that key, under a lock held to the end of the transaction
-- (jobs.schedule_timer).
SELECT CASE WHEN q.queue_found THEN {{s}}.schedule_timer(
    :queue,
    at => COALESCE(:at::timestamptz, now() + make_interval(secs => COALESCE(:delay::float8, 0))),
    data => :data::text::jsonb, key => :key::text) END AS id,
       q.queue_found
FROM {_FOUND}
""",
)
