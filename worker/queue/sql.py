"""Named SQL statements of the consumer side, rendered once per queue schema.

Each statement says what it guarantees. Every time comparison uses the database clock.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from api_sender.query import Query, Rendered

#: The claim instant goes out as its 8-byte binary form (``timestamptz_send``: the int64 of
#: microseconds PostgreSQL stores) and comes back in the fences as ``bytea``: equal bytes are
#: the same instant, and the worker, which only hands it back, skips a datetime decode and
#: encode per job (about 0.8 us of its CPU a job, measured at batch 500).
_JOB_COLUMNS = """j.id, j.data::text AS data, j.attempt, j.retry_count, j.retry_limit,
    j.singleton_key, j.expire_seconds, j.priority, timestamptz_send(j.started_at) AS claim"""


def _claim_next(queue: str, limit: str) -> str:
    """The candidate rows of a claim (the ``next`` CTE's body); ``{s}`` is filled by render."""
    return (
        "SELECT id FROM {s}.job\n"
        f"    WHERE queue = {queue} AND state < 'active' AND start_after <= now()\n"
        # A paused queue starts nothing: one look at its row (an InitPlan, evaluated once).
        f"      AND NOT (SELECT paused FROM {{s}}.queue WHERE name = {queue})\n"
        "    ORDER BY priority DESC, start_after, id\n"
        f"    LIMIT {limit}\n"
        "    FOR UPDATE SKIP LOCKED"
    )


#: Makes the statement's own (implicit) transaction commit without waiting for the WAL flush.
#: An uncorrelated subquery: evaluated once, as a one-time filter, whatever the row count.
_LAZY_COMMIT = "  AND (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL\n"
#: The same when the ``:lazy`` parameter is true and the server has no synchronous standby (an
#: acknowledged outcome must survive a failover then: contract section 12); otherwise the commit
#: is as the server says.
_LAZY_COMMIT_IF = (
    "  AND (SELECT CASE WHEN :lazy::bool AND current_setting('synchronous_standby_names') = ''\n"
    "              THEN set_config('synchronous_commit', 'off', true) ELSE '' END) IS NOT NULL\n"
)


def _claim_update(candidates: str, owner: str, *, lazy_commit: bool = False) -> str:
    """The UPDATE that claims the rows of CTE ``candidates`` for ``owner``."""
    return (
        "UPDATE {s}.job j\n"
        f"SET state = 'active', started_at = now(), locked_by = {owner}, attempt = j.attempt + 1\n"
        f"WHERE j.id = ANY(ARRAY(SELECT id FROM {candidates}))\n"
        + (_LAZY_COMMIT if lazy_commit else "")
        + "RETURNING {cols}"
    )


def _complete_update(
    ids: str, attempts: str, claims: str, owner: str, *, lazy_if: bool = False
) -> str:
    """The fenced completion UPDATE of jobs ``ids``/``attempts``/``claims`` held by ``owner``.

    No join with ``unnest(...)``: a prepared statement runs on a generic plan, which estimates
    the batch at one row and plans that join as a nested loop that unnests the three arrays
    again for every job, so a batch of 200 cost 20-45 ms and one of 400 four times that. Each
    row instead looks up its own entries by position: ``ids`` is sorted (``store.Fence``), so
    an id's last entry is at ``width_bucket(id, ids)`` (a binary search), which is the only
    entry of almost every job. Only when that entry does not match does the row look at every
    entry of its id (the positions after the last smaller id up to its own last one), so a job
    listed twice, claimed again after a lost claim, still matches the entry of its current
    claim. (Looking at every entry for every row, through a generate_series per row, cost
    about 1 µs more a job; ``array_positions`` scanned the whole batch per row: 0.17 ms more per
    batch of 200.)

    ``lazy_if``: the statement commits without waiting for the WAL flush when ``:lazy`` is true
    (the caller keeps the batch until the server has flushed it: worker.queue.unflushed).
    """
    return (
        "UPDATE {s}.job j\n"
        "SET state = 'completed', completed_at = now()\n"
        f"WHERE j.id = ANY({ids}::bigint[]) AND j.locked_by = {owner} AND j.state = 'active'\n"
        f"  AND (({attempts}::int[])[width_bucket(j.id, {ids}::bigint[])] = j.attempt\n"
        f"       AND ({claims}::bytea[])[width_bucket(j.id, {ids}::bigint[])]\n"
        "           = timestamptz_send(j.started_at)\n"
        f"    OR EXISTS (SELECT FROM generate_series(width_bucket(j.id - 1, {ids}::bigint[]) + 1,\n"
        f"                                           width_bucket(j.id, {ids}::bigint[])) AS p\n"
        f"               WHERE ({attempts}::int[])[p] = j.attempt\n"
        f"                 AND ({claims}::bytea[])[p] = timestamptz_send(j.started_at)))\n"
        + (_LAZY_COMMIT_IF if lazy_if else "")
        + "RETURNING j.id"
    )


CLAIM = (
    """
-- claim: up to `limit` due jobs of the queue in priority, then due-time, order (index job_fetch).
-- SKIP LOCKED: replicas never wait on each other's candidates. The attempt moves here, so a job
-- that kills its worker every time still runs out of attempts; owner, attempt and the claim's
-- started_at (returned as its timestamptz_send bytes, carried by the worker) fence every later
-- write. The locked ids are updated through "id = ANY(ARRAY(...))", which always reads job_pkey:
-- a join with the CTE may be planned as a hash join over a sequential scan of the whole table
-- (seen at batch 200 with 20,000 rows: 12 ms instead of 1).
-- The claim commits without waiting for the disk (synchronous_commit off for this statement
-- alone): the handler starts one WAL flush sooner. Only a crash of the server can lose such a
-- commit, and a lost claim is harmless under at-least-once: the job is waiting again with its
-- old attempt and runs again. The handler's outcome matches no row (fenced, logged as lease
-- lost), even when this same worker has meanwhile claimed the job again under the same attempt
-- number: that second claim has its own started_at (now() of a later transaction), and every
-- outcome matches started_at too. Failures and hand-backs always wait for the disk;
-- completions wait for it unless the worker keeps them until they are flushed (complete_and_claim).
WITH next AS (
    """
    + _claim_next(":queue", ":limit")
    + """
)
"""
    + _claim_update("next", ":owner", lazy_commit=True)
    + "\n"
)

CLAIM_ONE_PER_KEY = (
    """
-- claim for singleton/stately queues: as claim, but never a key that already has an active job
-- and at most one job per key. A concurrent claim of the same key by another replica is
-- refused by the unique index job_policy_active (the caller treats that as an empty claim).
-- Commits without waiting for the disk, as claim does.
WITH candidates AS (
    SELECT j.id, COALESCE(j.singleton_key, '') AS k, j.priority, j.start_after
    FROM {s}.job j
    WHERE j.queue = :queue AND j.state < 'active' AND j.start_after <= now()
      AND NOT (SELECT paused FROM {s}.queue WHERE name = :queue)
      AND NOT EXISTS (
          SELECT 1 FROM {s}.job a
          WHERE a.queue = j.queue AND a.state = 'active'
            AND COALESCE(a.singleton_key, '') = COALESCE(j.singleton_key, ''))
    ORDER BY j.priority DESC, j.start_after, j.id
    LIMIT :limit * 4
    FOR UPDATE SKIP LOCKED
), firsts AS (
    SELECT id FROM (
        SELECT DISTINCT ON (k) id, priority, start_after FROM candidates
        ORDER BY k, priority DESC, start_after, id
    ) per_key
    ORDER BY priority DESC, start_after, id
    LIMIT :limit
)
UPDATE {s}.job j
SET state = 'active', started_at = now(), locked_by = :owner, attempt = j.attempt + 1
WHERE j.id = ANY(ARRAY(SELECT id FROM firsts))
"""
    + _LAZY_COMMIT
    + "RETURNING {cols}\n"
)

COMPLETE = (
    """
-- complete: a batch in one statement, fenced on owner, attempt and claim instant (claims: each
-- claim's started_at as timestamptz_send bytes, as the claim returned it).
-- A job rescued from this worker (or expired), or claimed again after its claim was lost, no
-- longer matches and is left alone; its id is missing from the result.
-- The rows are found by id (id = ANY, or job_active, this owner's active jobs); each matches
-- its own attempt and claim instant by position in the arrays, with no join (see
-- _complete_update: a join with unnest() is planned as a nested loop on a generic plan).
"""
    + _complete_update(":ids", ":attempts", ":claims", ":owner")
    + "\n"
)

COMPLETE_LOST = (
    """
-- complete, as above, returning only the ids that did NOT match (lease lost): usually none, so
-- the answer is one empty array however large the batch. With lazy, the commit does not wait for
-- the WAL flush (see complete_and_claim).
WITH done AS (
"""
    + _complete_update(":ids", ":attempts", ":claims", ":owner", lazy_if=True)
    + """
)
SELECT ARRAY(SELECT unnest(:ids::bigint[]) EXCEPT ALL SELECT id FROM done) AS lost
"""
)

COMPLETE_AND_CLAIM = (
    """
-- complete, then claim: the outcomes of the previous batch (ids, attempts, claims = claim
-- instants, fenced on owner exactly as in complete) and the next batch of the queue (exactly
-- as in claim) in one statement, one round trip and one commit. The two touch disjoint rows
-- (active vs waiting), and a job is completed only if this statement commits, as with complete
-- alone. Every row carries the same "lost" array: the completed ids that did not match (usually
-- empty). With no job claimed, one row comes back whose job columns are NULL.
-- With lazy (the worker's default, see worker.queue.unflushed) the statement commits without
-- waiting for the WAL flush: the next claim starts one flush sooner. The worker keeps each such
-- batch until the server reports its WAL flushed past it, and writes it again (waiting for the
-- disk) if the server may have lost it meanwhile: a second write of a written completion
-- matches no row.
WITH done AS (
"""
    + _complete_update(":ids", ":attempts", ":claims", ":owner", lazy_if=True)
    + """
), next AS (
    """
    + _claim_next(":queue", ":limit")
    + """
), claimed AS (
"""
    + _claim_update("next", ":owner")
    + """
), lost AS (
    SELECT ARRAY(SELECT unnest(:ids::bigint[]) EXCEPT ALL SELECT id FROM done) AS lost
)
SELECT lost.lost, c.* FROM lost LEFT JOIN claimed c ON true
"""
)

FAIL = """
-- fail: failed attempts, fenced per job on owner and attempt. Below the retry limit a job waits
-- retry_delay (times 2^retry_count with backoff) in state retry; at the limit it is failed and a
-- copy of its data goes to its queue's dead letter (read now, so a dead letter added later still
-- covers older jobs). Queues with newly due work are notified.
-- A failure marked final (finals, per row: data that can never succeed, such as a payload that does
-- not validate) is at the limit whatever its retries left: failed at once, with its copy.
-- Every exhausted job gets its copy: the copy has no key and is not a timer, so only the
-- queued-per-key index job_policy_queued could refuse it, and only under a short or stately
-- policy. The install refuses such a dead letter; should one exist anyway (set outside the
-- install), its copies take the policy minus that limit (short -> standard, stately ->
-- singleton). No ON CONFLICT clause: a copy is never dropped silently.
-- The claim instant (claims, started_at) fences too: a claim lost and taken again is not failed.
-- No join with unnest(...) (see _complete_update: on a generic plan that join is a nested loop
-- unnesting the six arrays again for every job): each row finds its own entry by position.
-- A missing entry (a shorter array) reads NULL: it fences nothing, and a missing final flag is an
-- ordinary failure, never a final one.
WITH upd AS (
    UPDATE {s}.job j
    SET (state, start_after, completed_at, retry_count, output) = (
        SELECT CASE WHEN j.retry_count < j.retry_limit AND NOT f.final
                    THEN 'retry'::{s}.job_state ELSE 'failed'::{s}.job_state END,
               CASE WHEN j.retry_count < j.retry_limit AND NOT f.final
                    THEN now() + make_interval(secs => j.retry_delay
                         * CASE WHEN j.retry_backoff THEN power(2, LEAST(j.retry_count, 24))
                                ELSE 1 END)
                    ELSE j.start_after END,
               CASE WHEN j.retry_count < j.retry_limit AND NOT f.final
                    THEN NULL ELSE now() END,
               j.retry_count + 1,
               jsonb_build_object('error', f.error, 'attempt', f.attempt)
        FROM (SELECT (:errors::text[])[p] AS error, (:attempts::int[])[p] AS attempt,
                     COALESCE((:finals::bool[])[p], false) AS final
              FROM unnest(array_positions(:ids::bigint[], j.id)) AS p
              WHERE (:attempts::int[])[p] = j.attempt AND (:owners::uuid[])[p] = j.locked_by
                AND (:claims::bytea[])[p] = timestamptz_send(j.started_at)
              LIMIT 1) f)
    WHERE j.id = ANY(:ids::bigint[]) AND j.state = 'active'
      AND EXISTS (SELECT FROM unnest(array_positions(:ids::bigint[], j.id)) AS p
                  WHERE (:attempts::int[])[p] = j.attempt AND (:owners::uuid[])[p] = j.locked_by
                    AND (:claims::bytea[])[p] = timestamptz_send(j.started_at))
    RETURNING j.id, j.queue, j.state, j.data, j.priority, j.start_after
), dead AS (
    INSERT INTO {s}.job (queue, policy, data, priority, retry_limit, retry_delay, retry_backoff,
                         expire_seconds)
    SELECT d.name,
           CASE d.policy WHEN 'short' THEN 'standard' WHEN 'stately' THEN 'singleton'
                ELSE d.policy END,
           u.data, u.priority, d.retry_limit, d.retry_delay, d.retry_backoff, d.expire_seconds
    FROM upd u
    JOIN {s}.queue q ON q.name = u.queue
    JOIN {s}.queue d ON d.name = q.dead_letter
    WHERE u.state = 'failed'
    ORDER BY u.id
    RETURNING id, queue
), note AS (
    SELECT pg_notify('{channel}', x.queue) FROM (
        SELECT queue FROM upd WHERE state = 'retry' AND start_after <= now()
        UNION SELECT queue FROM dead
    ) x
)
SELECT u.id, u.state::text AS state, u.queue,
       (SELECT count(*) FROM note) AS notified,
       (SELECT count(*) FROM dead) AS dead_lettered
FROM upd u
"""

HAND_BACK = """
-- hand back: jobs this worker claimed but will not run (shutdown, grace exceeded) are due again
-- at once, in state retry so no queue policy can refuse them, without counting a failure.
-- Fenced as complete is (owner, attempt, claim instant), matched by position as complete is.
WITH back AS (
    UPDATE {s}.job j
    SET state = 'retry', start_after = now(), started_at = NULL, locked_by = NULL
    WHERE j.id = ANY(:ids::bigint[]) AND j.locked_by = :owner AND j.state = 'active'
      AND EXISTS (SELECT FROM unnest(array_positions(:ids::bigint[], j.id)) AS p
                  WHERE (:attempts::int[])[p] = j.attempt
                    AND (:claims::bytea[])[p] = timestamptz_send(j.started_at))
    RETURNING j.id, j.queue
), note AS (
    SELECT pg_notify('{channel}', queue) FROM (SELECT DISTINCT queue FROM back) x
)
SELECT id FROM back, (SELECT count(*) FROM note) n
"""

HAND_BACK_UNANSWERED = """
-- hand back unanswered claims: a claim whose answer never came (its connection failed under
-- it) may have committed, leaving jobs active under this worker that it never got; they would
-- wait out their expiry. Run with no claim of the queue in flight: every active job of the
-- queue this worker holds was then claimed by a claim whose instant is at most :since (the
-- newest one this poller had had back when the unanswered claim was sent), or by one answered
-- since (:kept, their instants), or by a claim never answered: those go back as hand back
-- does, due at once. Instants are compared as timestamptz_send bytes (an int64, big-endian,
-- positive after 2000, so byte order is time order).
WITH back AS (
    UPDATE {s}.job j
    SET state = 'retry', start_after = now(), started_at = NULL, locked_by = NULL
    WHERE j.locked_by = :owner AND j.state = 'active' AND j.queue = :queue
      AND (:since::bytea IS NULL OR timestamptz_send(j.started_at) > :since::bytea)
      AND timestamptz_send(j.started_at) <> ALL(:kept::bytea[])
    RETURNING j.id, j.queue
), note AS (
    SELECT pg_notify('{channel}', queue) FROM (SELECT DISTINCT queue FROM back) x
)
SELECT id FROM back, (SELECT count(*) FROM note) n
"""

JOB_STATES = """
-- outcomes that matched no row: what became of those jobs (cancelled by an operator, deleted,
-- or rescued), by primary key. Off the hot path: only when a write was fenced.
SELECT id, state::text AS state FROM {s}.job WHERE id = ANY(:ids::bigint[])
"""

CANCELLED_AMONG = """
-- cancelled among: which of this process's running claims (ids, attempts, claim instants) an
-- operator cancelled or deleted. A cancel NOTIFY only hints at this: anyone may send one, and one
-- sent for an earlier claim may arrive after the job was retried and claimed again. A row that is
-- gone was deleted (no outcome of any claim can be written to it). A cancelled row counts for a
-- claim only if no claim came after it: the attempt is the claim's (every claim moves it), and
-- the row still names this owner and the claim's instant (what a cancel leaves), or no claim at
-- all (retried or resumed since, then cancelled again: locked_by and started_at cleared). By
-- primary key (job_pkey), one probe per running job, after a cancel hint or every poll interval
-- with LISTEN_MODE=poll, and only while jobs run: never on the hot path.
SELECT r.id, r.attempt, r.claim
FROM unnest(:ids::bigint[], :attempts::int[], :claims::bytea[]) AS r (id, attempt, claim)
WHERE NOT EXISTS (
    SELECT 1 FROM {s}.job j
    WHERE j.id = r.id
      AND NOT (j.state = 'cancelled' AND j.attempt = r.attempt
               AND (j.started_at IS NULL AND j.locked_by IS NULL
                    OR j.locked_by IS NOT DISTINCT FROM :owner::uuid
                       AND timestamptz_send(j.started_at) IS NOT DISTINCT FROM r.claim)))
"""

HEARTBEAT = """
-- heartbeat: this process is alive. An upsert, so a worker row pruned while idle comes back.
INSERT INTO {s}.worker (id, host, pid) VALUES (:owner, :host, :pid)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()
"""

FORGET_WORKER = """
-- forget: a worker that stops cleanly removes its row.
DELETE FROM {s}.worker WHERE id = :owner
"""

PROBE = """
-- probe: the idle path, one read-only statement per poll interval for the whole process. Which
-- of the queues have due work, when the next future job is due, whether any active job needs a
-- rescue (its worker silent for stale_seconds, or past its expiry), and whether a finished job is
-- older than min_retention seconds, the shortest retention (index job_finished).
-- Due work and the next due time come from job_fetch alone by a loose index scan: per queue, one
-- seek per distinct waiting priority (usually one or two), then per priority the earliest
-- waiting job and the earliest future one. However many future-dated jobs wait (timers, held
-- usage), the probe reads a handful of index entries, and sends need no second waiting index.
WITH RECURSIVE priorities AS (
    SELECT q.queue, top.priority
    FROM unnest(:queues::text[]) AS q (queue)
    -- A paused queue is never due: its poller stays asleep until resume notifies it.
    JOIN {s}.queue pq ON pq.name = q.queue AND NOT pq.paused,
    LATERAL (
        SELECT j.priority FROM {s}.job j
        WHERE j.queue = q.queue AND j.state < 'active'
        ORDER BY j.priority DESC LIMIT 1) top
  UNION ALL
    SELECT p.queue, lower_.priority
    FROM priorities p,
    LATERAL (
        SELECT j.priority FROM {s}.job j
        WHERE j.queue = p.queue AND j.state < 'active' AND j.priority < p.priority
        ORDER BY j.priority DESC LIMIT 1) lower_
), firsts AS (
    SELECT p.queue,
        (SELECT j.start_after FROM {s}.job j
         WHERE j.queue = p.queue AND j.state < 'active' AND j.priority = p.priority
         ORDER BY j.start_after LIMIT 1) AS earliest,
        (SELECT j.start_after FROM {s}.job j
         WHERE j.queue = p.queue AND j.state < 'active' AND j.priority = p.priority
           AND j.start_after > now()
         ORDER BY j.start_after LIMIT 1) AS next_future
    FROM priorities p
)
SELECT
    ARRAY(SELECT DISTINCT f.queue FROM firsts f WHERE f.earliest <= now()) AS due,
    (SELECT min(f.next_future) FROM firsts f) - now() AS next_due_in,
    EXISTS (
        SELECT 1 FROM {s}.job j
        WHERE j.state = 'active'
          AND (j.started_at < now() - make_interval(secs => j.expire_seconds)
               OR (j.started_at < now() - make_interval(secs => :stale_seconds)
                   AND NOT EXISTS (
                       SELECT 1 FROM {s}.worker w
                       WHERE w.id = j.locked_by
                         AND w.heartbeat_at >= now() - make_interval(secs => :stale_seconds))))
    ) AS rescue,
    EXISTS (
        SELECT 1 FROM {s}.job j
        WHERE j.state > 'active' AND j.completed_at < now() - make_interval(secs => :min_retention)
    ) AS prunable
"""

RESCUE_CANDIDATES = """
-- rescue: active jobs whose worker has been silent for stale_seconds (dead, frozen or gone), and
-- active jobs past their expiry. The caller fails each as an attempt, fenced on owner, attempt
-- and claim instant, so a worker that completes one meanwhile wins, and a claim taken again
-- after this one was lost is not failed in its stead.
SELECT j.id, j.attempt, j.locked_by, timestamptz_send(j.started_at) AS claim,
       CASE WHEN j.started_at < now() - make_interval(secs => j.expire_seconds)
            THEN 'expired' ELSE 'worker lost' END AS reason,
       j.queue
FROM {s}.job j
WHERE j.state = 'active'
  AND (j.started_at < now() - make_interval(secs => j.expire_seconds)
       OR (j.started_at < now() - make_interval(secs => :stale_seconds)
           AND NOT EXISTS (
               SELECT 1 FROM {s}.worker w
               WHERE w.id = j.locked_by
                 AND w.heartbeat_at >= now() - make_interval(secs => :stale_seconds))))
ORDER BY j.id
LIMIT :limit
"""

PRUNE = """
-- prune: finished jobs past their queue's retention (failed ones past failed retention), oldest
-- first through index job_finished, at most limit rows per statement so no statement runs long.
-- min_retention is the smallest retention of any queue, the index range bound.
DELETE FROM {s}.job WHERE id IN (
    SELECT j.id FROM {s}.job j
    LEFT JOIN {s}.queue q ON q.name = j.queue
    WHERE j.state > 'active'
      AND j.completed_at < now() - make_interval(secs => :min_retention)
      AND j.completed_at < now() - make_interval(secs => CASE
            WHEN j.state = 'failed' THEN COALESCE(q.failed_retention_seconds, 604800)
            ELSE COALESCE(q.retention_seconds, 3600) END)
    ORDER BY j.completed_at
    LIMIT :limit
    FOR UPDATE OF j SKIP LOCKED
)
"""

PRUNE_WORKERS = """
-- prune workers: rows silent for a day that hold nothing.
DELETE FROM {s}.worker w
WHERE w.heartbeat_at < now() - interval '1 day'
  AND NOT EXISTS (SELECT 1 FROM {s}.job j WHERE j.state = 'active' AND j.locked_by = w.id)
"""

MIN_RETENTION = """
SELECT LEAST(COALESCE(min(retention_seconds), 3600), COALESCE(min(failed_retention_seconds),
       604800)) FROM {s}.queue
"""

UPSERT_QUEUE = """
-- install: create or update a queue; no write at all when nothing changed (boots stay cheap).
-- Returns the policy the queue had before (NULL for a new queue; no row when nothing changed),
-- read by the CTE from the statement's snapshot, before the upsert; the install lock keeps
-- another install from changing it in between.
WITH before AS (SELECT policy FROM {s}.queue WHERE name = :name)
INSERT INTO {s}.queue AS q (name, policy, retry_limit, retry_delay, retry_backoff,
                           expire_seconds, retention_seconds, failed_retention_seconds,
                           dead_letter)
VALUES (:name, :policy, :retry_limit, :retry_delay, :retry_backoff, :expire_seconds,
        :retention_seconds, :failed_retention_seconds, :dead_letter)
ON CONFLICT (name) DO UPDATE
SET policy = EXCLUDED.policy, retry_limit = EXCLUDED.retry_limit,
    retry_delay = EXCLUDED.retry_delay, retry_backoff = EXCLUDED.retry_backoff,
    expire_seconds = EXCLUDED.expire_seconds, retention_seconds = EXCLUDED.retention_seconds,
    failed_retention_seconds = EXCLUDED.failed_retention_seconds,
    dead_letter = EXCLUDED.dead_letter, updated_at = now()
WHERE (q.policy, q.retry_limit, q.retry_delay, q.retry_backoff, q.expire_seconds,
       q.retention_seconds, q.failed_retention_seconds, q.dead_letter)
      IS DISTINCT FROM
      (EXCLUDED.policy, EXCLUDED.retry_limit, EXCLUDED.retry_delay, EXCLUDED.retry_backoff,
       EXCLUDED.expire_seconds, EXCLUDED.retention_seconds, EXCLUDED.failed_retention_seconds,
       EXCLUDED.dead_letter)
RETURNING (SELECT policy FROM before) AS old_policy
"""

APPLY_POLICY = """
-- install: a queue's policy changed to `policy`; the jobs waiting on it follow (a job carries its
-- queue's policy so the policy indexes need no join; a job left on a stricter policy than its
-- queue's makes the plain claim collide with job_policy_active). Waiting jobs (created, retry)
-- only: they are locked by nothing but claims, which skip locked rows, so this UPDATE can wait
-- on a claim but never deadlock with one; running jobs finish under the policy they started
-- with (the fences and the one-per-key claim do not read it). Moving a waiting job is always
-- safe, except into a policy that allows one queued job per key (short, stately) when its key
-- has several jobs in created: those keep their policy and run (a send cannot be refused
-- after the fact), counted in "kept". Reads the queue's waiting rows through job_fetch.
WITH crowded AS (
    SELECT COALESCE(singleton_key, '') AS k FROM {s}.job
    WHERE queue = :queue AND state = 'created' AND :policy IN ('short', 'stately')
    GROUP BY 1 HAVING count(*) > 1
), candidates AS (
    SELECT count(*) AS n FROM {s}.job
    WHERE queue = :queue AND state < 'active' AND policy <> :policy
), moved AS (
    UPDATE {s}.job j SET policy = :policy
    WHERE j.queue = :queue AND j.state < 'active' AND j.policy <> :policy
      AND NOT (j.state = 'created' AND COALESCE(j.singleton_key, '') IN (SELECT k FROM crowded))
    RETURNING 1
)
SELECT (SELECT count(*) FROM moved) AS moved,
       (SELECT n FROM candidates) - (SELECT count(*) FROM moved) AS kept
"""

DEAD_LETTER_CONFLICTS = """
-- install: the given queues, or queues naming one of them as dead letter, whose dead letter
-- allows one queued job per key (short, stately). A dead-letter copy has no key, so such a dead
-- letter would keep one copy and refuse the rest: the install refuses the pair instead. Run in the
-- install's transaction after its upserts, under the install lock, so a dead letter declared by
-- another deployment, or changed by one, is seen as it will be committed.
SELECT q.name, q.dead_letter, d.policy
FROM {s}.queue q JOIN {s}.queue d ON d.name = q.dead_letter
WHERE d.policy IN ('short', 'stately')
  AND (q.name = ANY(:queues::text[]) OR d.name = ANY(:queues::text[]))
ORDER BY q.name
"""

QUEUE_EXISTS = "SELECT EXISTS (SELECT 1 FROM {s}.queue WHERE name = :queue)"

UPSERT_SCHEDULE = """
-- install: set a queue's cron. A new schedule starts at now(), so it fires at its next tick,
-- not at once; a changed cron keeps its last slot.
INSERT INTO {s}.schedule AS s (queue, cron, tz, data)
VALUES (:queue, :cron, :tz, :data::text::jsonb)
ON CONFLICT (queue) DO UPDATE
SET cron = EXCLUDED.cron, tz = EXCLUDED.tz, data = EXCLUDED.data, updated_at = now()
WHERE (s.cron, s.tz, s.data) IS DISTINCT FROM (EXCLUDED.cron, EXCLUDED.tz, EXCLUDED.data)
RETURNING queue
"""

DELETE_SCHEDULE = "DELETE FROM {s}.schedule WHERE queue = :queue RETURNING queue"

LOAD_SCHEDULES = """
SELECT queue, cron, tz, data::text AS data, last_slot, now() AS db_now FROM {s}.schedule
WHERE queue = ANY(:queues::text[])
"""

FIRE_SCHEDULE = """
-- cron tick: enqueue `slot` of the queue if and only if this call moves last_slot forward. The
-- UPDATE is a compare-and-set on the schedule row: however many replicas try the same slot,
-- exactly one moves it and inserts the job; a slot older than last_slot never fires.
WITH moved AS (
    UPDATE {s}.schedule SET last_slot = :slot, last_run = now()
    WHERE queue = :queue AND cron = :cron AND last_slot < :slot AND :slot <= now()
    RETURNING queue, data
), ins AS (
    INSERT INTO {s}.job (queue, policy, data, singleton_key, retry_limit, retry_delay,
                         retry_backoff, expire_seconds)
    SELECT q.name, q.policy, m.data, 'cron:' || to_char(:slot AT TIME ZONE 'UTC',
           'YYYY-MM-DD"T"HH24:MI:SS"Z"'), q.retry_limit, q.retry_delay, q.retry_backoff,
           q.expire_seconds
    FROM moved m JOIN {s}.queue q ON q.name = m.queue
    ON CONFLICT DO NOTHING
    RETURNING id, queue
), note AS (
    SELECT pg_notify('{channel}', queue) FROM ins
)
SELECT (SELECT id FROM ins) AS id, EXISTS (SELECT 1 FROM moved) AS moved,
       (SELECT count(*) FROM note) AS notified
"""

DB_NOW = "SELECT now()"

WAL_POSITION = """
-- wal_position: how far this server's WAL is inserted and flushed (bytes from 0/0), whether
-- this session may write, and the watch's session value (flush_watch). Read by the
-- worker's unflushed-completion watch (worker.queue.unflushed); reads nothing else, writes
-- nothing.
SELECT (pg_current_wal_insert_lsn() - '0/0')::int8 AS inserted,
       (pg_current_wal_flush_lsn() - '0/0')::int8 AS flushed,
       current_setting('transaction_read_only')::bool AS read_only,
       current_setting('chassis.flush_watch', true) AS token
"""

FLUSH_WATCH = """
-- the flush watch's own session: a value set on it alone, which wal_position reads back, so a
-- check that reached another server session (through a pooler) is seen.
SELECT set_config('chassis.flush_watch', :token, false)
"""

NOTIFY_SCHEDULES = """
-- install: the cron schedulers of every replica re-read their schedules (delivered on commit).
SELECT pg_notify(:channel, 'changed')
"""

COUNTS = """
-- queues: jobs per queue and state, and the age of the oldest job waiting to run (due now).
-- Reads no finished row, so its cost does not grow with retention: the finished states are the
-- sums of job_count (kept exact by the triggers of migration 0005, in the same transactions as
-- the changes, so one snapshot sees both consistently); the waiting ones are counted through
-- index job_fetch (the waiting set only), the active ones through job_active. Run it with jit
-- off: the planner's guess for an unanalysed queue table can exceed jit_above_cost, and
-- compiling costs more than this whole statement.
WITH finished AS (
    SELECT c.queue, c.state::text AS state, sum(c.n) AS n
    FROM {s}.job_count c GROUP BY c.queue, c.state
), active AS (
    SELECT j.queue, count(*) AS n FROM {s}.job j WHERE j.state = 'active' GROUP BY j.queue
)
SELECT q.name,
       jsonb_build_object(
           'created', w.created, 'retry', w.retry, 'active', COALESCE(a.n, 0),
           'completed', COALESCE(f.counts -> 'completed', '0'),
           'cancelled', COALESCE(f.counts -> 'cancelled', '0'),
           'failed', COALESCE(f.counts -> 'failed', '0'))::text AS counts,
       w.oldest_waiting_seconds, q.policy, q.dead_letter, q.paused, s.cron, s.last_run
FROM {s}.queue q
-- The schedule through view queue_schedule (0009): the api role has no right on the table.
LEFT JOIN {s}.queue_schedule s ON s.queue = q.name
LEFT JOIN active a ON a.queue = q.name
LEFT JOIN LATERAL (
    SELECT jsonb_object_agg(f.state, f.n) AS counts FROM finished f WHERE f.queue = q.name
) f ON true
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE j.state = 'created') AS created,
           count(*) FILTER (WHERE j.state = 'retry') AS retry,
           extract(epoch FROM now() - min(j.start_after) FILTER (WHERE j.start_after <= now()))
               AS oldest_waiting_seconds
    FROM {s}.job j WHERE j.queue = q.name AND j.state < 'active'
) w
ORDER BY q.name
"""

COMPACT_COUNTS = """
-- compact counts: folds the job_count rows of every (queue, state) that has more than `keep` of
-- them (piled up under contention, by repeatable-read writers or bulk inserts) into one, same
-- sums; skips rows a writer holds (SKIP LOCKED), so it never waits and may run anywhere.
SELECT {s}.job_count_compact(:keep)
"""

INSTALL_DONE = """
INSERT INTO {s}.install (id, completed_at, version) VALUES (1, now(), :version)
ON CONFLICT (id) DO UPDATE SET completed_at = now(), version = EXCLUDED.version
"""

INSTALL_STATE = """
-- api readiness: the newest migration and the install's completion, through view install_state
-- (0009): the api role has no right on schema_migration or install. A database migrated only by
-- an older release has no such view yet: undefined table, read as not installed.
SELECT version, installed_at FROM {s}.install_state
"""


@dataclass(frozen=True, slots=True)
class QueueStatements:
    """The consumer's statements rendered for one schema, each bound by parameter name."""

    claim: Rendered
    claim_one_per_key: Rendered
    complete: Rendered
    complete_lost: Rendered
    complete_and_claim: Rendered
    fail: Rendered
    hand_back: Rendered
    hand_back_unanswered: Rendered
    job_states: Rendered
    cancelled_among: Rendered
    heartbeat: Rendered
    forget_worker: Rendered
    probe: Rendered
    rescue_candidates: Rendered
    prune: Rendered
    prune_workers: Rendered
    min_retention: Rendered
    upsert_queue: Rendered
    apply_policy: Rendered
    dead_letter_conflicts: Rendered
    queue_exists: Rendered
    upsert_schedule: Rendered
    delete_schedule: Rendered
    load_schedules: Rendered
    fire_schedule: Rendered
    db_now: Rendered
    wal_position: Rendered
    flush_watch: Rendered
    counts: Rendered
    compact_counts: Rendered
    install_done: Rendered
    install_state: Rendered
    notify_schedules: Rendered


#: Every consumer statement, by the name it has in :class:`QueueStatements`.
STATEMENTS: tuple[Query, ...] = (
    Query("claim", CLAIM),
    Query("claim_one_per_key", CLAIM_ONE_PER_KEY),
    Query("complete", COMPLETE),
    Query("complete_lost", COMPLETE_LOST),
    Query("complete_and_claim", COMPLETE_AND_CLAIM),
    Query("fail", FAIL),
    Query("hand_back", HAND_BACK),
    Query("hand_back_unanswered", HAND_BACK_UNANSWERED),
    Query("job_states", JOB_STATES),
    Query("cancelled_among", CANCELLED_AMONG),
    Query("heartbeat", HEARTBEAT),
    Query("forget_worker", FORGET_WORKER),
    Query("probe", PROBE),
    Query("rescue_candidates", RESCUE_CANDIDATES),
    Query("prune", PRUNE),
    Query("prune_workers", PRUNE_WORKERS),
    Query("min_retention", MIN_RETENTION),
    Query("upsert_queue", UPSERT_QUEUE),
    Query("apply_policy", APPLY_POLICY),
    Query("dead_letter_conflicts", DEAD_LETTER_CONFLICTS),
    Query("queue_exists", QUEUE_EXISTS),
    Query("upsert_schedule", UPSERT_SCHEDULE),
    Query("delete_schedule", DELETE_SCHEDULE),
    Query("load_schedules", LOAD_SCHEDULES),
    Query("fire_schedule", FIRE_SCHEDULE),
    Query("db_now", DB_NOW),
    Query("wal_position", WAL_POSITION),
    Query("flush_watch", FLUSH_WATCH),
    Query("counts", COUNTS),
    Query("compact_counts", COMPACT_COUNTS),
    Query("install_done", INSTALL_DONE),
    Query("install_state", INSTALL_STATE),
    Query("notify_schedules", NOTIFY_SCHEDULES),
)


@functools.cache
def render(schema: str) -> QueueStatements:
    """Render every consumer statement for ``schema`` (validated and quoted), once per schema:
    the boot, the runtime, the gauges and the install all ask for them."""
    return QueueStatements(
        **{query.name: query.render(schema, cols=_JOB_COLUMNS) for query in STATEMENTS}
    )
