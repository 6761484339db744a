"""Named SQL statements of the producer side (the :class:`~api_sender.query.Query` convention).

Every statement takes the data as JSON text (``:data::text::jsonb``) and returns ids and JSON as
plain values, so they work on any driver (asyncpg, psycopg 3, SQLAlchemy, Django) whatever type
codecs its owner installed.
"""

from __future__ import annotations

from .query import Query

# Shared by send and send_many: the job takes the queue's retry policy unless the caller overrides
# it, and its policy is copied so the singleton indexes need no join. ON CONFLICT DO NOTHING (no
# target) yields no row when a short/stately queue already has that key queued.
_INSERT_COLUMNS = """
    queue, policy, data, priority, singleton_key, start_after,
    retry_limit, retry_delay, retry_backoff, expire_seconds"""

SEND = Query(
    "send",
    f"""
-- send: one job. The NOTIFY is transactional (delivered on commit, dropped on rollback) and
-- carries only the queue name when the job is due now; a job due later sends an empty payload,
-- which makes listening workers re-read when the next job is due (timers fire on time).
WITH q AS (
    SELECT name, policy, retry_limit, retry_delay, retry_backoff, expire_seconds
    FROM {{s}}.queue WHERE name = :queue
), ins AS (
    INSERT INTO {{s}}.job ({_INSERT_COLUMNS})
    SELECT q.name, q.policy, :data::text::jsonb, :priority::int, :singleton_key::text,
           COALESCE(:at::timestamptz, now() + make_interval(secs => COALESCE(:delay::float8, 0))),
           COALESCE(:retry_limit::int, q.retry_limit),
           COALESCE(:retry_delay::int, q.retry_delay),
           COALESCE(:retry_backoff::bool, q.retry_backoff),
           COALESCE(:expire_seconds::int, q.expire_seconds)
    FROM q
    ON CONFLICT DO NOTHING
    RETURNING id, start_after <= now() AS due
), note AS (
    SELECT pg_notify('{{channel}}', CASE WHEN ins.due THEN :queue ELSE '' END) FROM ins
)
SELECT (SELECT id FROM ins) AS id,
       EXISTS (SELECT 1 FROM q) AS queue_found,
       (SELECT count(*) FROM note) AS notified
""",
)

SEND_MANY = Query(
    "send_many",
    f"""
-- send_many: many jobs of one queue in one statement (one round trip, one NOTIFY, as in send),
-- so a batch is enqueued all or nothing. :keys optionally gives each item its own singleton key
-- (a NULL array pads every item with NULL, which falls back to the shared key :singleton_key).
-- Everything the jobs share (due time, retry policy, expiry) is worked out once, in q; each row
-- adds only its data and key. Two INSERTs, of which only the one matching the queue's policy
-- gets rows: on short/stately queues ON CONFLICT DO NOTHING lets job_policy_queued refuse a
-- second queued job of a key; on every other policy no unique index can refuse a new job
-- (job_policy_* and job_timer_key do not cover it, the id is an identity), so it skips ON
-- CONFLICT's per-row speculative insertion. A unique index that could refuse a job of another
-- policy must extend the first branch.
WITH q AS (
    SELECT name, policy,
           COALESCE(:at::timestamptz, now() + make_interval(secs => COALESCE(:delay::float8, 0)))
               AS start_after,
           COALESCE(:retry_limit::int, retry_limit) AS retry_limit,
           COALESCE(:retry_delay::int, retry_delay) AS retry_delay,
           COALESCE(:retry_backoff::bool, retry_backoff) AS retry_backoff,
           COALESCE(:expire_seconds::int, expire_seconds) AS expire_seconds
    FROM {{s}}.queue WHERE name = :queue
), keyed AS (
    INSERT INTO {{s}}.job ({_INSERT_COLUMNS})
    SELECT q.name, q.policy, d.data::jsonb, :priority::int,
           COALESCE(d.key, :singleton_key::text), q.start_after,
           q.retry_limit, q.retry_delay, q.retry_backoff, q.expire_seconds
    FROM q, unnest(:items::text[], :keys::text[]) WITH ORDINALITY AS d(data, key, n)
    WHERE q.policy IN ('short', 'stately')
    ORDER BY d.n
    ON CONFLICT DO NOTHING
    RETURNING id
), plain AS (
    INSERT INTO {{s}}.job ({_INSERT_COLUMNS})
    SELECT q.name, q.policy, d.data::jsonb, :priority::int,
           COALESCE(d.key, :singleton_key::text), q.start_after,
           q.retry_limit, q.retry_delay, q.retry_backoff, q.expire_seconds
    FROM q, unnest(:items::text[], :keys::text[]) WITH ORDINALITY AS d(data, key, n)
    WHERE q.policy NOT IN ('short', 'stately')
    ORDER BY d.n
    RETURNING id
), ins AS (
    SELECT id FROM keyed UNION ALL SELECT id FROM plain
), note AS (
    SELECT pg_notify('{{channel}}', CASE WHEN q.start_after <= now() THEN :queue ELSE '' END)
    FROM q WHERE EXISTS (SELECT 1 FROM ins)
)
SELECT EXISTS (SELECT 1 FROM q) AS queue_found,
       ARRAY(SELECT id FROM ins ORDER BY id) AS ids,
       (SELECT count(*) FROM note) AS notified
""",
)

CANCEL_TIMER = Query(
    "cancel_timer",
    """
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
WHERE queue = :queue AND singleton_key = :key AND is_timer
  AND (state = 'created' OR state = 'retry' OR state = 'active')
RETURNING id
""",
)

LOCK_TIMER_KEY = Query(
    "lock_timer_key",
    """
-- timers.schedule: serialise replaces of one (queue, key) for the rest of the transaction.
SELECT pg_advisory_xact_lock(hashtextextended('{s}:timer:' || :queue || ':' || :key, 0))
""",
)

SEND_TIMER = Query(
    "send_timer",
    f"""
-- timers.schedule: the new keyed timer, due at an instant or after a delay (database clock).
WITH q AS (
    SELECT name, policy, retry_limit, retry_delay, retry_backoff, expire_seconds
    FROM {{s}}.queue WHERE name = :queue
), ins AS (
    INSERT INTO {{s}}.job ({_INSERT_COLUMNS}, is_timer)
    SELECT q.name, 'standard', :data::text::jsonb, 0, :key::text,
           COALESCE(:at::timestamptz, now() + make_interval(secs => COALESCE(:delay::float8, 0))),
           q.retry_limit, q.retry_delay, q.retry_backoff, q.expire_seconds, :key::text IS NOT NULL
    FROM q
    RETURNING id, start_after <= now() AS due
), note AS (
    SELECT pg_notify('{{channel}}', CASE WHEN ins.due THEN :queue ELSE '' END) FROM ins
)
SELECT (SELECT id FROM ins) AS id,
       EXISTS (SELECT 1 FROM q) AS queue_found,
       (SELECT count(*) FROM note) AS notified
""",
)
