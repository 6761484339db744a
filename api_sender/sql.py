"""Named SQL statements of the producer side, rendered once per queue schema.

Every statement takes the data as JSON text (``$n::text::jsonb``) and returns ids and JSON as
plain values, so they work on any asyncpg pool whatever type codecs its owner installed.
"""

from __future__ import annotations

from dataclasses import dataclass

from .schema import notify_channel, quoted

# Shared by send and send_many: the job takes the queue's retry policy unless the caller overrides
# it, and its policy is copied so the singleton indexes need no join. ON CONFLICT DO NOTHING (no
# target) yields no row when a short/stately queue already has that key queued.
_INSERT_COLUMNS = """
    queue, policy, data, priority, singleton_key, start_after,
    retry_limit, retry_delay, retry_backoff, expire_seconds"""

_SEND = """
-- send: one job. The NOTIFY is transactional (delivered on commit, dropped on rollback) and
-- carries only the queue name when the job is due now; a job due later sends an empty payload,
-- which makes listening workers re-read when the next job is due (timers fire on time).
WITH q AS (
    SELECT name, policy, retry_limit, retry_delay, retry_backoff, expire_seconds
    FROM {s}.queue WHERE name = $1
), ins AS (
    INSERT INTO {s}.job ({cols})
    SELECT q.name, q.policy, $2::text::jsonb, $3::int, $4::text,
           COALESCE($6::timestamptz, now() + make_interval(secs => COALESCE($5::float8, 0))),
           COALESCE($7::int, q.retry_limit), COALESCE($8::int, q.retry_delay),
           COALESCE($9::bool, q.retry_backoff), COALESCE($10::int, q.expire_seconds)
    FROM q
    ON CONFLICT DO NOTHING
    RETURNING id, start_after <= now() AS due
), note AS (
    SELECT pg_notify('{channel}', CASE WHEN ins.due THEN $1 ELSE '' END) FROM ins
)
SELECT (SELECT id FROM ins) AS id,
       EXISTS (SELECT 1 FROM q) AS queue_found,
       (SELECT count(*) FROM note) AS notified
"""

_SEND_MANY = """
-- send_many: many jobs of one queue in one statement (one round trip, one NOTIFY, as in send),
-- so a batch is enqueued all or nothing. $11 optionally gives each item its own singleton key (a
-- NULL array pads every item with NULL, which falls back to the shared key $4).
-- Everything the jobs share (due time, retry policy, expiry) is worked out once, in q; each row
-- adds only its data and key. Two INSERTs, of which only the one matching the queue's policy
-- gets rows: on short/stately queues ON CONFLICT DO NOTHING lets job_policy_queued refuse a
-- second queued job of a key; on every other policy no unique index can refuse a new job
-- (job_policy_* and job_timer_key do not cover it, the id is an identity), so it skips ON
-- CONFLICT's per-row speculative insertion. A unique index that could refuse a job of another
-- policy must extend the first branch.
WITH q AS (
    SELECT name, policy,
           COALESCE($6::timestamptz, now() + make_interval(secs => COALESCE($5::float8, 0)))
               AS start_after,
           COALESCE($7::int, retry_limit) AS retry_limit,
           COALESCE($8::int, retry_delay) AS retry_delay,
           COALESCE($9::bool, retry_backoff) AS retry_backoff,
           COALESCE($10::int, expire_seconds) AS expire_seconds
    FROM {s}.queue WHERE name = $1
), keyed AS (
    INSERT INTO {s}.job ({cols})
    SELECT q.name, q.policy, d.data::jsonb, $3::int, COALESCE(d.key, $4::text), q.start_after,
           q.retry_limit, q.retry_delay, q.retry_backoff, q.expire_seconds
    FROM q, unnest($2::text[], $11::text[]) WITH ORDINALITY AS d(data, key, n)
    WHERE q.policy IN ('short', 'stately')
    ORDER BY d.n
    ON CONFLICT DO NOTHING
    RETURNING id
), plain AS (
    INSERT INTO {s}.job ({cols})
    SELECT q.name, q.policy, d.data::jsonb, $3::int, COALESCE(d.key, $4::text), q.start_after,
           q.retry_limit, q.retry_delay, q.retry_backoff, q.expire_seconds
    FROM q, unnest($2::text[], $11::text[]) WITH ORDINALITY AS d(data, key, n)
    WHERE q.policy NOT IN ('short', 'stately')
    ORDER BY d.n
    RETURNING id
), ins AS (
    SELECT id FROM keyed UNION ALL SELECT id FROM plain
), note AS (
    SELECT pg_notify('{channel}', CASE WHEN q.start_after <= now() THEN $1 ELSE '' END)
    FROM q WHERE EXISTS (SELECT 1 FROM ins)
)
SELECT EXISTS (SELECT 1 FROM q) AS queue_found,
       ARRAY(SELECT id FROM ins ORDER BY id) AS ids,
       (SELECT count(*) FROM note) AS notified
"""

_CANCEL_TIMER = """
-- timers.cancel (and the first half of a replace): the timer of (queue, key) that has not
-- finished, if any, becomes cancelled, whether it waits (created, retry) or runs (active). A
-- running one keeps running to its end, but every outcome its worker writes (complete, fail,
-- hand back) and every rescue is fenced on state = 'active', so it matches nothing: the timer
-- never runs again and never goes back to retry beside its replacement. A concurrent outcome
-- write holds the row lock; this UPDATE waits for it and re-checks the row's new state, so a
-- timer that just went to retry is cancelled too and one that just completed is left alone.
-- The states are spelled out one by one so each finds a partial index (a BitmapOr): created
-- through job_timer_key (queue, key), retry through job_fetch (the queue's waiting entries, as
-- before), active through job_active (the small running set); "state <= 'active'" matches no
-- partial index and reads the whole table.
UPDATE {s}.job SET state = 'cancelled', completed_at = now()
WHERE queue = $1 AND singleton_key = $2 AND is_timer
  AND (state = 'created' OR state = 'retry' OR state = 'active')
RETURNING id
"""

_LOCK_TIMER_KEY = """
-- timers.schedule: serialise replaces of one (queue, key) for the rest of the transaction.
SELECT pg_advisory_xact_lock(hashtextextended('{s}:timer:' || $1 || ':' || $2, 0))
"""

_SEND_TIMER = """
-- timers.schedule: the new keyed timer, due at an instant or after a delay (database clock).
WITH q AS (
    SELECT name, policy, retry_limit, retry_delay, retry_backoff, expire_seconds
    FROM {s}.queue WHERE name = $1
), ins AS (
    INSERT INTO {s}.job ({cols}, is_timer)
    SELECT q.name, 'standard', $2::text::jsonb, 0, $3::text,
           COALESCE($4::timestamptz, now() + make_interval(secs => COALESCE($5::float8, 0))),
           q.retry_limit, q.retry_delay, q.retry_backoff, q.expire_seconds, $3::text IS NOT NULL
    FROM q
    RETURNING id, start_after <= now() AS due
), note AS (
    SELECT pg_notify('{channel}', CASE WHEN ins.due THEN $1 ELSE '' END) FROM ins
)
SELECT (SELECT id FROM ins) AS id,
       EXISTS (SELECT 1 FROM q) AS queue_found,
       (SELECT count(*) FROM note) AS notified
"""


@dataclass(frozen=True, slots=True)
class SenderStatements:
    """The producer's statements for one schema."""

    send: str
    send_many: str
    cancel_timer: str
    lock_timer_key: str
    send_timer: str


def render(schema: str) -> SenderStatements:
    """Render every producer statement for ``schema`` (validated and quoted)."""
    values = {"s": quoted(schema), "channel": notify_channel(schema), "cols": _INSERT_COLUMNS}
    return SenderStatements(
        send=_SEND.format(**values),
        send_many=_SEND_MANY.format(**values),
        cancel_timer=_CANCEL_TIMER.format(**values),
        lock_timer_key=_LOCK_TIMER_KEY.format(**values),
        send_timer=_SEND_TIMER.format(**values),
    )
