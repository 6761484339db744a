"""Named statements of the held-event operator tools, rendered once per queue schema.

"Held" means: a job on the held queue not yet re-sent (the held worker takes it within a poll),
or a usage-queue job the held worker re-sent that waits for its next round (state created, due
in the future: nothing else sends future-dated usage). Both ranges are read through the partial
index job_fetch (a scan of the queue's waiting jobs, fine for an operator tool). Events are
picked all at once, by event id, or by job id (for data without one).
"""

from __future__ import annotations

from dataclasses import dataclass

from api_sender.schema import notify_channel, quoted

_HELD = """(
    (j.queue = $1 AND j.state = 'created' AND j.start_after > now())
    OR (j.queue = $2 AND j.state < 'active'))"""


def _picked(first: int) -> str:
    """Select every held event (``$first`` true), or those named by event id or job id."""
    return (
        f"(${first}::bool OR j.data->>'id' = ANY(${first + 1}::text[]) "
        f"OR j.id = ANY(${first + 2}::bigint[]))"
    )


LIST = """
-- held list: every held event, next due first.
SELECT j.id AS job_id, j.queue, j.state::text AS state, j.singleton_key,
       j.data::text AS data, j.start_after, j.start_after <= now() AS due
FROM {s}.job j
WHERE {held} AND {picked3}
ORDER BY j.start_after, j.id
LIMIT $6
"""

COUNT = """
-- held list: how many events are held in all (the listing may be cut at its limit).
SELECT count(*) FROM {s}.job j WHERE {held}
"""

REDRIVE_WAITING = """
-- held redrive: re-sent events waiting for their round become due now. Only rows still in state
-- created and future-dated match, so a job claimed meanwhile is left to its worker. The NOTIFY
-- wakes the usage pollers on commit.
WITH due AS (
    UPDATE {s}.job j SET start_after = now()
    WHERE j.queue = $1 AND j.state = 'created' AND j.start_after > now() AND {picked2}
    RETURNING j.id, COALESCE(j.data->>'id', 'job:' || j.id) AS event_id
), note AS (
    SELECT pg_notify('{channel}', $1) WHERE EXISTS (SELECT 1 FROM due)
)
SELECT due.id, due.event_id, (SELECT count(*) FROM note) AS notified FROM due
"""

LOCK_HELD = """
-- held redrive: held-queue jobs not yet re-sent, locked for this transaction. SKIP LOCKED: a job
-- the held worker is claiming right now is its to re-send.
SELECT j.id, j.data::text AS data, COALESCE(j.data->>'id', 'job:' || j.id) AS event_id
FROM {s}.job j
WHERE j.queue = $1 AND j.state < 'active' AND {picked2}
ORDER BY j.id
FOR UPDATE OF j SKIP LOCKED
"""

SETTLE_HELD = """
-- held redrive: the locked held-queue jobs are done, their events re-sent in this transaction.
UPDATE {s}.job SET state = 'completed', completed_at = now(),
    output = jsonb_build_object('redriven_by', $2::text)
WHERE id = ANY($1::bigint[])
"""

DISCARD = """
-- held discard: the held jobs of the named events are cancelled (kept readable until retention
-- prunes them), with who discarded them. Rows a worker claimed meanwhile no longer match.
UPDATE {s}.job j SET state = 'cancelled', completed_at = now(),
    output = jsonb_build_object('discarded_by', $6::text)
WHERE {held} AND {picked3}
RETURNING j.id, j.queue, COALESCE(j.data->>'id', 'job:' || j.id) AS event_id
"""

AUDIT = """
-- held redrive/discard: the action's one audit row ($3: usage.redrive or usage.discard), in
-- the action's transaction: no event leaves undelivered without one. Instance-level
-- (workspace_id NULL); $1 is the surface (cli, api, console, python), $2 the principal.
INSERT INTO public.audit_log
    (workspace_id, actor_via, principal, action, resource_type, resource_id, metadata)
VALUES (NULL, $1, $2, $3, 'usage_event', NULL, $4::text::jsonb)
"""


@dataclass(frozen=True, slots=True)
class HeldStatements:
    """The held tools' statements for one schema."""

    list_held: str
    count_held: str
    redrive_waiting: str
    lock_held: str
    settle_held: str
    discard: str
    audit: str


def render(schema: str) -> HeldStatements:
    """Render every held-tool statement for ``schema`` (validated and quoted)."""
    values = {"s": quoted(schema), "channel": notify_channel(schema)}
    values["held"] = _HELD.format(**values)
    values["picked2"] = _picked(2)
    values["picked3"] = _picked(3)
    return HeldStatements(
        list_held=LIST.format(**values),
        count_held=COUNT.format(**values),
        redrive_waiting=REDRIVE_WAITING.format(**values),
        lock_held=LOCK_HELD.format(**values),
        settle_held=SETTLE_HELD.format(**values),
        discard=DISCARD.format(**values),
        audit=AUDIT,
    )
