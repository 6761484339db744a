"""The statements of job and queue management (contract section 10), one per name.

Every action is one statement: it changes the rows, wakes the workers that must hear of it
(``NOTIFY``, delivered on commit) and writes its one ``audit_log`` row, so an action and its
record commit together or not at all. Each action names the states it moves jobs out of, and
its ``UPDATE``/``DELETE`` re-checks them on the row it locks (READ COMMITTED re-evaluates the
``WHERE`` on the newest row version), so a job that moved meanwhile is left alone.
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


_RETRY = """UPDATE {{s}}.job j
    SET state = 'retry', start_after = now(), started_at = NULL, completed_at = NULL,
        locked_by = NULL,
        -- One more attempt: an exhausted job (retry_count past its limit) may fail once more.
        retry_limit = GREATEST(j.retry_limit, j.retry_count)
    WHERE {target}
    RETURNING j.id, j.queue"""

_CANCEL = """UPDATE {{s}}.job j
    SET state = 'cancelled', completed_at = now()
    WHERE {target}
    RETURNING j.id, j.queue, j.locked_by"""

# cancelled -> created. On short/stately queues (and keyed timers) a key may hold one created
# job only: a cancelled job whose key has another one waiting stays cancelled (not an error).
_RESUME = """UPDATE {{s}}.job j
    SET state = 'created', completed_at = NULL, started_at = NULL, locked_by = NULL
    WHERE {target}
      AND NOT EXISTS (
          SELECT 1 FROM {{s}}.job o
          WHERE o.queue = j.queue AND o.state = 'created' AND o.id <> j.id
            AND COALESCE(o.singleton_key, '') = COALESCE(j.singleton_key, '')
            AND ((j.policy IN ('short', 'stately') AND o.policy IN ('short', 'stately'))
                 OR (j.is_timer AND o.is_timer)))
    RETURNING j.id, j.queue"""

_DELETE = """DELETE FROM {{s}}.job j
    WHERE {target}
    RETURNING j.id, j.queue, CASE WHEN j.state = 'active' THEN j.locked_by END AS locked_by"""

RETRY_IDS = _job_action("retry", "job.retry", _RETRY, _WAKE, by_filter=False)
RETRY_WHERE = _job_action("retry", "job.retry", _RETRY, _WAKE, by_filter=True)
CANCEL_IDS = _job_action("cancel", "job.cancel", _CANCEL, _INTERRUPT, by_filter=False)
CANCEL_WHERE = _job_action("cancel", "job.cancel", _CANCEL, _INTERRUPT, by_filter=True)
RESUME_IDS = _job_action("resume", "job.resume", _RESUME, _WAKE, by_filter=False)
RESUME_WHERE = _job_action("resume", "job.resume", _RESUME, _WAKE, by_filter=True)
DELETE_IDS = _job_action("delete", "job.delete", _DELETE, _INTERRUPT, by_filter=False)
DELETE_WHERE = _job_action("delete", "job.delete", _DELETE, _INTERRUPT, by_filter=True)


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
