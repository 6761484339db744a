"""The statements of job and queue management (contract section 10), one per name.

Every action's change is one statement: it changes the rows, wakes the workers that must hear
of it (``NOTIFY``, delivered on commit) and writes its one ``audit_log`` row, so an action and
its record commit together or not at all. Each action names the states it moves jobs out of, and
its ``UPDATE``/``DELETE`` re-checks them on the row it locks (READ COMMITTED re-evaluates the
``WHERE`` on the newest row version), so a job that moved meanwhile is left alone. Resume and
retry, which must keep each key's promise, run a locking statement before it, in the same
transaction (:class:`KeyedAction`).
"""

from __future__ import annotations

from .query import Query

#: The columns of a :class:`~api_sender.jobs.Job`, as text and plain values (no codecs needed).
JOB_COLUMNS = """j.id, j.queue, j.state::text AS state, j.data::text AS data, j.priority,
    j.singleton_key, j.attempt, j.retry_count, j.retry_limit, j.start_after, j.created_at,
    j.started_at, j.completed_at, j.output ->> 'error' AS error"""

GET_JOB = Query(
    "get_job",
    f"""
-- jobs.get: one job by primary key.
SELECT {JOB_COLUMNS} FROM {{s}}.job j WHERE j.id = :id
""",
)

#: What a filter matches: one queue, some states, created in [since, until). A NULL bound is
#: open. Used by the ``*_where`` actions and their dry-run counts alike, so both see one set.
_FILTER = """j.queue = :queue
      AND j.state = ANY(:states::text[]::{s}.job_state[])
      AND (:since::timestamptz IS NULL OR j.created_at >= :since::timestamptz)
      AND (:until::timestamptz IS NULL OR j.created_at < :until::timestamptz)"""

COUNT_WHERE = Query(
    "count_where",
    f"""
-- dry run of a filter action: how many jobs it would change now; changes nothing.
SELECT count(*) FROM {{s}}.job j WHERE {_FILTER}
""",
)


#: What an action by ids matches: those ids, in the states the action moves jobs out of.
_BY_IDS = """j.id = ANY(:ids::bigint[])
      AND j.state = ANY(:states::text[]::{s}.job_state[])"""


def _audit(
    action: str, resource_type: str, resource: str, metadata: str, when: str = "true"
) -> str:
    """The CTE that writes an action's one audit row (chassis table ``public.audit_log``).

    No RETURNING: the api role may INSERT into the audit log but not read it (config/roles.sql),
    and a data-modifying CTE runs whether or not it is read."""
    return f"""audit AS (
    INSERT INTO public.audit_log
        (workspace_id, actor_via, principal, action, resource_type, resource_id, metadata)
    SELECT NULL, :actor_via, :principal, '{action}', '{resource_type}', {resource}, {metadata}
    WHERE {when}
)"""


#: resource_id of a job action: the job's id when exactly one was asked for, else NULL.
_ONE_ID = "CASE WHEN cardinality(:ids::bigint[]) = 1 THEN (:ids::bigint[])[1]::text END"
_IDS_METADATA = """jsonb_build_object(
        'ids', COALESCE((SELECT jsonb_agg(id ORDER BY id) FROM changed), '[]'::jsonb),
        'requested', to_jsonb(:ids::bigint[]),
        'count', (SELECT count(*) FROM changed))"""
_FILTER_METADATA = """jsonb_build_object(
        'filter', :filter::text::jsonb, 'count', (SELECT count(*) FROM changed))"""

#: The answer of every job action: the changed ids (at most :shown, ascending), their count,
#: and the NOTIFY side effect forced to run (a SELECT CTE runs only when read).
_RESULT = """
SELECT ARRAY(SELECT id FROM changed ORDER BY id LIMIT :shown) AS ids,
       (SELECT count(*) FROM changed) AS changed,
       (SELECT count(*) FROM note) AS notified
"""

#: Wakes workers for queues that got due work back (retry, resume).
_WAKE = """note AS (
    SELECT pg_notify('{channel}', q.queue) FROM (SELECT DISTINCT queue FROM changed) q
)"""

#: Tells the replicas running cancelled or deleted jobs to interrupt them: one message per
#: owner and at most 400 ids (a NOTIFY payload holds 8,000 bytes). A row whose locked_by is
#: stale (an earlier claim's) only makes that owner look for a job it does not run.
_INTERRUPT = """note AS (
    SELECT pg_notify('{cancel_channel}', m.owner || ' ' || m.ids) FROM (
        SELECT locked_by::text AS owner, string_agg(id::text, ',') AS ids
        FROM (SELECT id, locked_by, (row_number() OVER (PARTITION BY locked_by ORDER BY id)
                                     - 1) / 400 AS part
              FROM changed WHERE locked_by IS NOT NULL) c
        GROUP BY locked_by, part) m
)"""


def _job_action(name: str, action: str, change: str, side: str, *, by_filter: bool) -> Query:
    target = _FILTER if by_filter else _BY_IDS
    audit = (
        _audit(action, "job", "NULL", _FILTER_METADATA)
        if by_filter
        else _audit(action, "job", _ONE_ID, _IDS_METADATA)
    )
    return Query(
        f"{name}_{'where' if by_filter else 'ids'}",
        f"""
-- jobs.{name}{"_where" if by_filter else ""}: see the module docstring.
WITH changed AS (
    {change.format(target=target)}
), {side}, {audit}
{_RESULT}""",
    )


_CANCEL = """UPDATE {{s}}.job j
    SET state = 'cancelled', completed_at = now()
    WHERE {target}
    RETURNING j.id, j.queue, j.locked_by"""

_DELETE = """DELETE FROM {{s}}.job j
    WHERE {target}
    RETURNING j.id, j.queue, CASE WHEN j.state = 'active' THEN j.locked_by END AS locked_by"""

CANCEL_IDS = _job_action("cancel", "job.cancel", _CANCEL, _INTERRUPT, by_filter=False)
CANCEL_WHERE = _job_action("cancel", "job.cancel", _CANCEL, _INTERRUPT, by_filter=True)
DELETE_IDS = _job_action("delete", "job.delete", _DELETE, _INTERRUPT, by_filter=False)
DELETE_WHERE = _job_action("delete", "job.delete", _DELETE, _INTERRUPT, by_filter=True)


# Resume and retry put jobs back in the waiting states, where a key may hold one job only:
# one pending timer per (queue, key) (job_timer_key guards state created; a replace cancels
# whatever of the key is created, retry or active, so all three count as pending), and one
# created job per key on a short or stately queue (job_policy_queued). Retry puts jobs in
# state retry, which job_policy_queued does not cover on purpose (a job waiting for its retry
# is outside the limits, migration 0001), so retry is bound by the timer promise only.
#
# Of the jobs an action matches, each key under a promise gets back only its newest one, and
# only when no other job of that key holds the place; the others stay as they are and are
# counted as skipped. Checked in a single statement, two transactions could each see the
# place free and both take it: the check must come after a lock that orders them, in a
# snapshot taken after that lock. So these actions are two statements in one transaction:
# the first takes a transaction-scoped advisory lock per free place (ascending, so two
# actions never deadlock), the second checks the places again in its new snapshot
# (READ COMMITTED) and changes only jobs whose lock it holds. A timer key's lock is the one
# jobs.schedule_timer takes (migration 0007), so a replace and a resume of one key are
# ordered too. A short or stately queue's sends take no lock (ON CONFLICT DO NOTHING): their
# places are locked per queue, which orders resumes, and a send racing a resume makes the
# resume's UPDATE fail on job_policy_queued, which the caller retries (api_sender.jobs).

#: The advisory lock of a timer key: the very expression of jobs.schedule_timer, whose
#: @s_literal@ is the schema as a quoted identifier, which is what {s} renders.
_TIMER_LOCK = "hashtextextended('{{s}}' || ':timer:' || {t}.queue || ':' || {t}.singleton_key, 0)"
#: The advisory lock of the created places of one short or stately queue.
_QUEUED_LOCK = "hashtextextended('{{s}}' || ':queued:' || {t}.queue, 0)"


def _keyed(target: str, queued_guard: str) -> str:
    """The CTEs every keyed statement shares: ``cand``, the jobs ``target`` matches, each with
    the promises it falls under; ``free``, those an action would change: every job under no
    promise, and the newest of each key whose place is free."""
    return f"""cand AS (
    SELECT j.id, j.queue, j.singleton_key, j.is_timer AS timer_guard,
           {queued_guard} AS queued_guard
    FROM {{s}}.job j
    -- Resume and retry move jobs out of these states only. Spelled as literals, they imply
    -- job_settled's predicate, so a filter reads that index; the :states parameter, cast to
    -- the enum at run time, cannot (the job list writes its state into the text likewise).
    WHERE {target} AND j.state IN ('cancelled', 'failed')
), ranked AS (
    -- The jobs under a promise, newest first per key; the rest (most jobs) skip the sorts.
    SELECT c.*,
           row_number() OVER (PARTITION BY c.queue, c.singleton_key, c.timer_guard
                              ORDER BY c.id DESC) AS timer_rank,
           row_number() OVER (PARTITION BY c.queue, COALESCE(c.singleton_key, ''),
                                           c.queued_guard ORDER BY c.id DESC) AS queued_rank
    FROM cand c
    WHERE c.timer_guard OR c.queued_guard
), pending AS (
    -- The timer keys (of a newest candidate) with a pending timer: created, retry or active,
    -- each state spelled out so it finds its partial index (job_timer_key, job_settled,
    -- job_active) among millions of finished rows.
    SELECT o.queue, o.singleton_key FROM ranked r
    JOIN {{s}}.job o ON o.queue = r.queue AND o.singleton_key = r.singleton_key
    WHERE r.timer_guard AND r.timer_rank = 1 AND o.is_timer AND o.state = 'created'
    UNION
    SELECT o.queue, o.singleton_key FROM ranked r
    JOIN {{s}}.job o ON o.queue = r.queue AND o.singleton_key = r.singleton_key
    WHERE r.timer_guard AND r.timer_rank = 1 AND o.is_timer AND o.state = 'retry'
    UNION
    SELECT o.queue, o.singleton_key FROM ranked r
    JOIN {{s}}.job o ON o.queue = r.queue AND o.singleton_key = r.singleton_key
    WHERE r.timer_guard AND r.timer_rank = 1 AND o.is_timer AND o.state = 'active'
), queued AS (
    -- The keys (of a newest candidate) with a created job on a short or stately queue: the
    -- predicate of job_policy_queued.
    SELECT DISTINCT o.queue, COALESCE(o.singleton_key, '') AS k FROM ranked r
    JOIN {{s}}.job o
      ON o.queue = r.queue AND COALESCE(o.singleton_key, '') = COALESCE(r.singleton_key, '')
    WHERE r.queued_guard AND r.queued_rank = 1
      AND o.state = 'created' AND o.policy IN ('short', 'stately')
), free AS (
    SELECT c.id, c.queue, c.singleton_key, c.timer_guard, c.queued_guard FROM cand c
    WHERE NOT c.timer_guard AND NOT c.queued_guard
    UNION ALL
    -- Joins, not NOT EXISTS under an OR: the planner prices those as one probe per candidate,
    -- and past jit_above_cost a dry run spent a second compiling (measured on 200k jobs).
    SELECT r.id, r.queue, r.singleton_key, r.timer_guard, r.queued_guard FROM ranked r
    LEFT JOIN pending p
      ON r.timer_guard AND p.queue = r.queue AND p.singleton_key = r.singleton_key
    LEFT JOIN queued u
      ON r.queued_guard AND u.queue = r.queue AND u.k = COALESCE(r.singleton_key, '')
    WHERE (NOT r.timer_guard OR (r.timer_rank = 1 AND p.queue IS NULL))
      AND (NOT r.queued_guard OR (r.queued_rank = 1 AND u.queue IS NULL))
)"""


#: The locks of the free places: one per timer key, one per short or stately queue.
_WANTED = f"""wanted AS (
    SELECT {_TIMER_LOCK.format(t="f")} AS k
    FROM free f WHERE f.timer_guard
    UNION
    SELECT {_QUEUED_LOCK.format(t="f")} FROM free f WHERE f.queued_guard
)"""


#: How many jobs were held back by a key's promise (matched, but not chosen).
_SKIPPED = "(SELECT count(*) FROM cand) - (SELECT count(*) FROM chosen)"
#: The audit metadata of resume and retry: the other actions' and the count skipped.
_KEYED_IDS_METADATA = f"""jsonb_build_object(
        'ids', COALESCE((SELECT jsonb_agg(id ORDER BY id) FROM changed), '[]'::jsonb),
        'requested', to_jsonb(:ids::bigint[]),
        'count', (SELECT count(*) FROM changed),
        'skipped', {_SKIPPED})"""
_KEYED_FILTER_METADATA = f"""jsonb_build_object(
        'filter', :filter::text::jsonb, 'count', (SELECT count(*) FROM changed),
        'skipped', {_SKIPPED})"""


#: The first statement of resume and retry. Their second statement must see the commits of
#: the lock holders it waited for, which only READ COMMITTED's new snapshot per statement does
#: (under REPEATABLE READ the snapshot predates the locks, and two actions could each put back a
#: job of one key). In the action's own transaction this sets it whatever the server's
#: default_transaction_isolation; in a caller's transaction that is already READ COMMITTED it
#: is a no-op; in a caller's REPEATABLE READ or SERIALIZABLE one that has run a query it fails
#: with SQLSTATE 25001, which the caller hears as InvalidArgument (api_sender.jobs).
READ_COMMITTED = Query("read_committed", "SET TRANSACTION ISOLATION LEVEL READ COMMITTED")


class KeyedAction:
    """The statements of resume or retry (see the comment above): ``lock`` then ``act``, by
    ids or by filter, and the dry run's ``count``."""

    def __init__(self, name: str, action: str, change: str, queued_guard: str) -> None:
        self.lock_ids = self._lock(name, _BY_IDS, queued_guard, by_filter=False)
        self.lock_where = self._lock(name, _FILTER, queued_guard, by_filter=True)
        self.act_ids = self._act(name, action, change, _BY_IDS, queued_guard, by_filter=False)
        self.act_where = self._act(name, action, change, _FILTER, queued_guard, by_filter=True)
        self.count_where = Query(
            f"{name}_count_where",
            f"""
-- dry run of jobs.{name}_where: how many jobs it would change now, how many it would skip,
-- and how many locks it would take; changes nothing, locks nothing.
WITH {_keyed(_FILTER, queued_guard)}, {_WANTED}
SELECT (SELECT count(*) FROM free) AS count,
       (SELECT count(*) FROM cand) - (SELECT count(*) FROM free) AS skipped,
       (SELECT count(*) FROM wanted) AS wanted
""",
        )

    @staticmethod
    def _lock(name: str, target: str, queued_guard: str, *, by_filter: bool) -> Query:
        return Query(
            f"{name}_lock_{'where' if by_filter else 'ids'}",
            f"""
-- jobs.{name}{"_where" if by_filter else ""}, first statement: lock the free places, in
-- ascending order, to the end of the transaction; none when there are more than :max_locks
-- (each takes a slot of the server's shared lock table), which the caller refuses. The lock
-- runs after the sort: PostgreSQL evaluates a volatile output column above the ORDER BY.
WITH {_keyed(target, queued_guard)}, {_WANTED}, counted AS (
    SELECT count(*) AS n FROM wanted
)
SELECT (SELECT n FROM counted) AS wanted,
       ARRAY(SELECT l.k FROM (
           SELECT w.k, pg_advisory_xact_lock(w.k) AS taken FROM wanted w
           WHERE (SELECT n FROM counted) <= :max_locks::bigint
           ORDER BY w.k) l) AS locked
""",
        )

    @staticmethod
    def _act(
        name: str, action: str, change: str, target: str, queued_guard: str, *, by_filter: bool
    ) -> Query:
        audit = (
            _audit(action, "job", "NULL", _KEYED_FILTER_METADATA)
            if by_filter
            else _audit(action, "job", _ONE_ID, _KEYED_IDS_METADATA)
        )
        return Query(
            f"{name}_{'where' if by_filter else 'ids'}",
            f"""
-- jobs.{name}{"_where" if by_filter else ""}, second statement: in a snapshot taken after
-- the first statement's locks, the places are checked again; a job under a promise changes
-- only when its place is still free and this transaction holds its lock (:locked). The
-- UPDATE re-checks the state on the row it locks, so a job that moved meanwhile is left alone.
WITH {_keyed(target, queued_guard)}, chosen AS (
    SELECT f.id FROM free f
    WHERE (NOT f.timer_guard
           OR {_TIMER_LOCK.format(t="f")} = ANY(:locked::bigint[]))
      AND (NOT f.queued_guard OR {_QUEUED_LOCK.format(t="f")} = ANY(:locked::bigint[]))
), changed AS (
    {change.format(target=target)}
), {_WAKE}, {audit}
SELECT ARRAY(SELECT id FROM changed ORDER BY id LIMIT :shown) AS ids,
       (SELECT count(*) FROM changed) AS changed,
       {_SKIPPED} AS skipped,
       (SELECT count(*) FROM note) AS notified
""",
        )


RETRY = KeyedAction(
    "retry",
    "job.retry",
    """UPDATE {{s}}.job j
    SET state = 'retry', start_after = now(), started_at = NULL, completed_at = NULL,
        locked_by = NULL,
        -- One more attempt: an exhausted job (retry_count past its limit) may fail once more.
        retry_limit = GREATEST(j.retry_limit, j.retry_count)
    FROM chosen c
    WHERE j.id = c.id AND {target}
    RETURNING j.id, j.queue""",
    # A job waiting for its retry is outside a short or stately queue's limit.
    queued_guard="false",
)
RESUME = KeyedAction(
    "resume",
    "job.resume",
    """UPDATE {{s}}.job j
    SET state = 'created', completed_at = NULL, started_at = NULL, locked_by = NULL
    FROM chosen c
    WHERE j.id = c.id AND {target}
    RETURNING j.id, j.queue""",
    queued_guard="j.policy IN ('short', 'stately')",
)


def _queue_action(name: str, action: str, change: str, note: str, metadata: str) -> Query:
    return Query(
        f"queue_{name}",
        f"""
-- queues.{name}: see the module docstring. found is false for a queue that is not installed.
WITH q AS (
    SELECT name FROM {{s}}.queue WHERE name = :queue FOR UPDATE
), changed AS (
    {change}
), note AS (
    {note}
), {_audit(action, "queue", "(SELECT name FROM q)", metadata, "EXISTS (SELECT 1 FROM q)")}
SELECT EXISTS (SELECT 1 FROM q) AS found, (SELECT count(*) FROM changed) AS changed,
       (SELECT count(*) FROM note) AS notified
""",
    )


# The audit row is written only for a queue that exists (its INSERT reads q).
QUEUE_PAUSE = _queue_action(
    "pause",
    "queue.pause",
    "UPDATE {s}.queue SET paused = true, updated_at = now()\n"
    "    WHERE name = (SELECT name FROM q) AND NOT paused RETURNING name",
    "SELECT 1 WHERE false",
    "jsonb_build_object('paused', true, 'changed', (SELECT count(*) FROM changed))",
)
QUEUE_RESUME = _queue_action(
    "resume",
    "queue.resume",
    "UPDATE {s}.queue SET paused = false, updated_at = now()\n"
    "    WHERE name = (SELECT name FROM q) AND paused RETURNING name",
    # Wake every replica at once: their probes skipped the queue while it was paused.
    "SELECT pg_notify('{channel}', name) FROM q",
    "jsonb_build_object('paused', false, 'changed', (SELECT count(*) FROM changed))",
)
QUEUE_PURGE = _queue_action(
    "purge",
    "queue.purge",
    "DELETE FROM {s}.job j WHERE j.queue = (SELECT name FROM q)\n"
    "      AND j.state IN ('created', 'retry') RETURNING j.id",
    "SELECT 1 WHERE false",
    "jsonb_build_object('count', (SELECT count(*) FROM changed))",
)


#: The job states, in enum order (the only values a list's state filter may take).
JOB_STATES = ("created", "retry", "active", "completed", "cancelled", "failed")
_LIST_CONDITIONS = {
    "queue": "j.queue = :queue",
    "key": "j.singleton_key = :key",
    "after": "j.id < :after",
}
_LISTS: dict[tuple[str | None, bool, bool, bool], Query] = {}


def list_jobs(queue: bool, state: str | None, key: bool, after: bool) -> Query:
    """jobs.list with the given filters: fixed text per combination, so each one is prepared
    once and planned for its own filters (no ``:x IS NULL OR ...`` that defeats the index).

    The state is written into the text, one statement per state (a name checked against the
    enum, never the caller's text): a parameter would let the plan cache settle on a generic
    plan, which cannot use the partial index job_settled for the few failed, cancelled and
    retry jobs among millions of completed ones.
    """
    if state is not None and state not in JOB_STATES:
        raise ValueError(f"unknown job state {state!r}")
    flags = (state, queue, key, after)
    query = _LISTS.get(flags)
    if query is None:
        on = {"queue": queue, "key": key, "after": after}
        used = [cond for name, cond in _LIST_CONDITIONS.items() if on[name]]
        if state is not None:
            used.insert(1 if queue else 0, f"j.state = '{state}'")
        where = " AND ".join(used) or "true"
        tag = "".join(name[0] for name in _LIST_CONDITIONS if on[name]) + (state or "")
        query = _LISTS[flags] = Query(
            f"list_jobs_{tag or 'all'}",
            f"""
-- jobs.list: newest first (by id), keyset-paginated on id; :limit is one more than the page
-- so the caller knows whether a next page exists. Filtered on a failed, cancelled or retry
-- state, it reads job_settled (queue, state, id) backwards.
SELECT {JOB_COLUMNS} FROM {{s}}.job j
WHERE {where}
ORDER BY j.id DESC
LIMIT :limit
""",
        )
    return query
