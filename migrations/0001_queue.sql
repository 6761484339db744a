-- The durable queue: queues with their policy, jobs with pg-boss's states, cron schedules,
-- worker liveness and the install marker.
--
-- The runner applies this file with search_path set to the queue schema (JOBS_SCHEMA), so every
-- name here lands in that schema. Time is always the database's: now(), never a worker clock.

CREATE TYPE job_state AS ENUM ('created', 'retry', 'active', 'completed', 'cancelled', 'failed');

CREATE TABLE queue (
    name                     text PRIMARY KEY
                             CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,99}$'),
    -- pg-boss's policies: standard (no limit), short (one queued per key), singleton (one active
    -- per key), stately (one queued and one active per key).
    policy                   text NOT NULL DEFAULT 'standard'
                             CHECK (policy IN ('standard', 'short', 'singleton', 'stately')),
    retry_limit              integer NOT NULL DEFAULT 2 CHECK (retry_limit >= 0),
    retry_delay              integer NOT NULL DEFAULT 0 CHECK (retry_delay >= 0),
    retry_backoff            boolean NOT NULL DEFAULT false,
    expire_seconds           integer NOT NULL DEFAULT 900 CHECK (expire_seconds > 0),
    -- How long completed and cancelled jobs stay readable, then how long failed ones do.
    retention_seconds        integer NOT NULL DEFAULT 3600 CHECK (retention_seconds >= 0),
    failed_retention_seconds integer NOT NULL DEFAULT 604800 CHECK (failed_retention_seconds >= 0),
    dead_letter              text REFERENCES queue (name) ON DELETE SET NULL,
    created_at               timestamptz NOT NULL DEFAULT now(),
    updated_at               timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE job (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue          text NOT NULL,
    -- Copied from the queue at insert so the singleton indexes below need no join.
    policy         text NOT NULL DEFAULT 'standard',
    state          job_state NOT NULL DEFAULT 'created',
    priority       integer NOT NULL DEFAULT 0,
    data           jsonb,
    singleton_key  text,
    -- A keyed one-off timer: at most one pending per (queue, key), see job_timer_key.
    is_timer       boolean NOT NULL DEFAULT false,
    retry_limit    integer NOT NULL,
    -- Failed attempts so far (a rescued job counts as one): the backoff exponent.
    retry_count    integer NOT NULL DEFAULT 0,
    retry_delay    integer NOT NULL,
    retry_backoff  boolean NOT NULL,
    expire_seconds integer NOT NULL,
    start_after    timestamptz NOT NULL DEFAULT now(),
    created_at     timestamptz NOT NULL DEFAULT now(),
    started_at     timestamptz,
    completed_at   timestamptz,
    -- The claim's fence: which process holds the job and for which claim. Every later write
    -- matches both, so a worker whose job was rescued cannot complete it late.
    locked_by      uuid,
    attempt        integer NOT NULL DEFAULT 0,
    output         jsonb
);

-- The claim path: waiting jobs of one queue in priority, then due-time, then creation order
-- (jobs sent without a delay are due when created, so for them this is creation order).
-- Partial, so millions of finished rows never enter it.
CREATE INDEX job_fetch ON job (queue, priority DESC, start_after, id) WHERE state < 'active';
-- Rescue, heartbeat and hand-back scan only the (small) active set.
CREATE INDEX job_active ON job (locked_by) WHERE state = 'active';
-- Retention deletes finished rows oldest first.
CREATE INDEX job_finished ON job (completed_at) WHERE state > 'active';

-- Queue policies, enforced by the database so concurrent sends and claims cannot break them.
-- "Queued" means state created: a job waiting for its retry is outside the limits, so a failure
-- can never collide with a newer send, and a claim that would put a second job of one key into
-- active is excluded by the claim query (the index is the backstop).
CREATE UNIQUE INDEX job_policy_queued ON job (queue, COALESCE(singleton_key, ''))
    WHERE state = 'created' AND policy IN ('short', 'stately');
CREATE UNIQUE INDEX job_policy_active ON job (queue, COALESCE(singleton_key, ''))
    WHERE state = 'active' AND policy IN ('singleton', 'stately');
-- At most one pending keyed timer per (queue, key); a replace cancels the old one first.
CREATE UNIQUE INDEX job_timer_key ON job (queue, singleton_key)
    WHERE is_timer AND state = 'created';

-- One cron per queue. last_slot is the newest tick already enqueued: a tick fires when a
-- replica moves last_slot forward, a compare-and-set that exactly one replica can win.
CREATE TABLE schedule (
    queue      text PRIMARY KEY REFERENCES queue (name) ON DELETE CASCADE,
    cron       text NOT NULL,
    tz         text NOT NULL DEFAULT 'UTC',
    data       jsonb,
    last_slot  timestamptz NOT NULL DEFAULT now(),
    last_run   timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Liveness of worker processes. A worker beats only while it holds jobs (an idle worker writes
-- nothing), so a job is rescued when both its claim and its worker's last beat are stale.
-- Unlogged: heartbeats cost no WAL; after a crash the table is empty and live workers re-insert
-- their row within one beat, well inside the stale limit.
CREATE UNLOGGED TABLE worker (
    id           uuid PRIMARY KEY,
    host         text NOT NULL,
    pid          integer NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

-- Set by the worker install when every queue and schedule is in place; the api role waits for it.
CREATE TABLE install (
    id           integer PRIMARY KEY CHECK (id = 1),
    completed_at timestamptz NOT NULL,
    version      text NOT NULL
);
