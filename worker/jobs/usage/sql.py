"""Named statements of the held-event operator tools, rendered once per queue schema.

"Held" means: a job on the held queue not yet re-sent (the held worker takes it within a poll),
or a usage-queue job the held worker re-sent that waits for its next round (state created, due
in the future: nothing else sends future-dated usage). Both ranges are read through the partial
index job_fetch (a scan of the queue's waiting jobs, fine for an operator tool). Events are
picked all at once, by event id, or by job id (for data without one).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from api_sender.query import Query, Rendered

#: Held events: the usage queue's future-dated waiting jobs, or the held queue's waiting jobs.
_HELD = """(
    (j.queue = :usage_queue AND j.state = 'created' AND j.start_after > now())
    OR (j.queue = :held_queue AND j.state < 'active'))"""

#: Every held event (``everything`` true), or those named by event id or job id.
_PICKED = """(:everything::bool OR j.data->>'id' = ANY(:event_ids::text[])
     OR j.id = ANY(:job_ids::bigint[]))"""

LIST = Query(
    "list_held",
    f"""
-- held list: every held event, next due first.
SELECT j.id AS job_id, j.queue, j.state::text AS state, j.singleton_key,
       j.data::text AS data, j.start_after, j.start_after <= now() AS due
FROM {{s}}.job j
WHERE {_HELD} AND {_PICKED}
ORDER BY j.start_after, j.id
LIMIT :limit
""",
)

COUNT = Query(
    "count_held",
    f"""
-- held list: how many events are held in all (the listing may be cut at its limit).
SELECT count(*) FROM {{s}}.job j WHERE {_HELD}
""",
)

REDRIVE_WAITING = Query(
    "redrive_waiting",
    f"""
-- held redrive: re-sent events waiting for their round become due now. Only rows still in state
-- created and future-dated match, so a job claimed meanwhile is left to its worker. The NOTIFY
-- wakes the usage pollers on commit.
WITH due AS (
    UPDATE {{s}}.job j SET start_after = now()
    WHERE j.queue = :usage_queue AND j.state = 'created' AND j.start_after > now() AND {_PICKED}
    RETURNING j.id, COALESCE(j.data->>'id', 'job:' || j.id) AS event_id
), note AS (
    SELECT pg_notify('{{channel}}', :usage_queue) WHERE EXISTS (SELECT 1 FROM due)
)
SELECT due.id, due.event_id, (SELECT count(*) FROM note) AS notified FROM due
""",
)

LOCK_HELD = Query(
    "lock_held",
    f"""
-- held redrive: held-queue jobs not yet re-sent, locked for this transaction. SKIP LOCKED: a job
-- the held worker is claiming right now is its to re-send.
SELECT j.id, j.data::text AS data, COALESCE(j.data->>'id', 'job:' || j.id) AS event_id
FROM {{s}}.job j
WHERE j.queue = :held_queue AND j.state < 'active' AND {_PICKED}
ORDER BY j.id
FOR UPDATE OF j SKIP LOCKED
""",
)

SETTLE_HELD = Query(
    "settle_held",
    """
-- held redrive: the locked held-queue jobs are done, their events re-sent in this transaction.
UPDATE {s}.job SET state = 'completed', completed_at = now(),
    output = jsonb_build_object('redriven_by', :actor::text)
WHERE id = ANY(:ids::bigint[])
""",
)

DISCARD = Query(
    "discard",
    f"""
-- held discard: the held jobs of the named events are cancelled (kept readable until retention
-- prunes them), with who discarded them. Rows a worker claimed meanwhile no longer match.
UPDATE {{s}}.job j SET state = 'cancelled', completed_at = now(),
    output = jsonb_build_object('discarded_by', :actor::text)
WHERE {_HELD} AND {_PICKED}
RETURNING j.id, j.queue, COALESCE(j.data->>'id', 'job:' || j.id) AS event_id
""",
)

AUDIT = Query(
    "audit",
    """
-- held redrive/discard: the action's one audit row (action: usage.redrive or usage.discard), in
-- the action's transaction: no event leaves undelivered without one. Instance-level
-- (workspace_id NULL); via is the surface (cli, api, console, python), principal who acted.
INSERT INTO public.audit_log
    (workspace_id, actor_via, principal, action, resource_type, resource_id, metadata)
VALUES (NULL, :via, :principal, :action, 'usage_event', NULL, :metadata::text::jsonb)
""",
)


@dataclass(frozen=True, slots=True)
class HeldStatements:
    """The held tools' statements for one schema, each bound by parameter name."""

    list_held: Rendered
    count_held: Rendered
    redrive_waiting: Rendered
    lock_held: Rendered
    settle_held: Rendered
    discard: Rendered
    audit: Rendered


@functools.cache
def render(schema: str) -> HeldStatements:
    """Render every held-tool statement for ``schema`` (validated and quoted), once per schema
    (a HeldStore is made per console request)."""
    queries = (LIST, COUNT, REDRIVE_WAITING, LOCK_HELD, SETTLE_HELD, DISCARD, AUDIT)
    return HeldStatements(**{query.name: query.render(schema) for query in queries})
