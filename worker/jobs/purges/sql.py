"""Named SQL statements of the nightly purges, one statement per name (``:name`` parameters).

The chassis tables are always ``public.<name>``, so their statements are rendered once, here;
the purge run record lives in the queue schema and is rendered per schema. Every time
comparison takes the run's clock as a parameter (``:now``, read once per run by
:data:`READ_CLOCK`), never ``now()``: one pass measures every row against the same instant.
"""

from __future__ import annotations

from api_sender.query import Query, Rendered
from api_sender.schema import quoted


def _chassis(name: str, sql: str) -> Rendered:
    """A statement on the chassis tables: the same text whatever the queue schema."""
    return Query(name, sql).render("public")


READ_CLOCK = _chassis(
    "read_clock",
    """
-- the run's one clock: read once, passed to every later statement of the run.
SELECT now()
""",
)

DELETE_AUDIT_BATCH = _chassis(
    "delete_audit_batch",
    """
-- audit-purge batch: at most limit rows older than now - retention_days days, oldest first,
-- found through the audit_log(created_at) index so the statement stays short however large
-- the table is.
DELETE FROM public.audit_log
WHERE id IN (
    SELECT id FROM public.audit_log
    WHERE created_at < :now::timestamptz - make_interval(days => :retention_days::int)
    ORDER BY created_at
    LIMIT :limit
)
""",
)

DELETE_IDEMPOTENCY_BATCH = _chassis(
    "delete_idempotency_batch",
    """
-- idempotency-purge batch: at most limit rows past their expires_at (index on expires_at).
DELETE FROM public.idempotency_keys
WHERE (workspace_id, key) IN (
    SELECT workspace_id, key FROM public.idempotency_keys
    WHERE expires_at < :now::timestamptz
    ORDER BY expires_at
    LIMIT :limit
)
""",
)

RETIRE_EXPIRED_API_KEYS = _chassis(
    "retire_expired_api_keys",
    """
-- apikey-expiry-sweep: expired keys already fail authentication; this moves them to the visible
-- terminal state. api_keys is small and the partial index holds only unrevoked keys with an
-- expiry, so one statement suffices.
UPDATE public.api_keys
SET revoked_at = expires_at
WHERE revoked_at IS NULL AND expires_at IS NOT NULL AND expires_at < :now::timestamptz
""",
)

#: The orphan rule for user ``u`` (contract section 7), shared by the candidate scan and the
#: re-check so the two can never drift apart: created before now - retention_hours, no
#: membership row at all (deactivated ones count), no session live at now, no live pending
#: invitation for the email in any letter case, not a verified address of the superadmin list
#: superadmins (one jsonb array of trimmed, lower-cased emails), not the instance operator.
_ORPHAN_RULE = """u.created_at < :now::timestamptz - make_interval(hours => :retention_hours::int)
  AND NOT EXISTS (SELECT 1 FROM public.workspace_members m WHERE m.user_id = u.id)
  AND NOT EXISTS (
      SELECT 1 FROM public.session s WHERE s.user_id = u.id AND s.expires_at > :now::timestamptz)
  AND NOT EXISTS (
      SELECT 1 FROM public.invitations i
      WHERE lower(i.email) = lower(u.email)
        AND i.accepted_at IS NULL
        AND i.revoked_at IS NULL
        AND i.expires_at > :now::timestamptz)
  AND NOT EXISTS (
      SELECT 1 FROM jsonb_array_elements_text(:superadmins::jsonb) AS sa (email)
      WHERE u.email_verified AND sa.email = lower(btrim(u.email)))
  AND u.id IS DISTINCT FROM (
      SELECT operator_user_id FROM public.instance_settings WHERE id = 1)"""

ORPHAN_CANDIDATES = _chassis(
    "orphan_candidates",
    f"""
-- orphan-user-purge candidates: at most limit users the orphan rule selects at now that were
-- not already passed over in this run (passed, a jsonb array of ids). Every exclusion is here,
-- not in the caller, so a user the sweep must keep never takes a slot of the batch.
SELECT u.id, u.email
FROM public."user" u
WHERE {_ORPHAN_RULE}
  AND NOT EXISTS (
      SELECT 1 FROM jsonb_array_elements_text(:passed::jsonb) AS skipped (id)
      WHERE skipped.id = u.id)
ORDER BY u.created_at, u.id
LIMIT :limit
""",
)

USER_TRANSACTION_LIMITS = _chassis(
    "user_transaction_limits",
    """
-- orphan-user-purge, in each user's transaction: how long a lock may be waited for
-- (lock_wait) before the statement fails, so a table or row the app keeps locked is given up
-- on, never waited on for long; and a cap on any one statement.
SELECT set_config('lock_timeout', :lock_wait, true), set_config('statement_timeout', '30s', true)
""",
)

LOCK_EXCLUSION_TABLES = _chassis(
    "lock_exclusion_tables",
    """
-- orphan-user-purge, first lock of each user's transaction: nothing ties an invitation to a user
-- row (it names an email), and an app's own instance_settings may have no foreign key on
-- operator_user_id, so no row lock can see a write to them coming. SHARE conflicts only with
-- writers (ROW EXCLUSIVE): one in flight makes this wait for its commit, so the re-check sees
-- it; one that comes later waits the few milliseconds until this user's transaction ends.
-- Readers are never blocked. Taken before the user row, so an app transaction that writes one
-- of these tables and then references the user (accepting an invitation adds a membership;
-- naming the operator checks its foreign key) never waits on us while we wait on it.
LOCK TABLE public.invitations, public.instance_settings IN SHARE MODE
""",
)

LOCK_USER = _chassis(
    "lock_user",
    """
-- orphan-user-purge, after the table locks: FOR UPDATE conflicts with the FOR KEY SHARE lock
-- that inserting a membership or a session (or pointing operator_user_id at the user, when that
-- column has its foreign key) takes on the user row, and with any update of the row (a changed
-- email or verification): one in flight makes this wait for its commit, and one that comes
-- later waits for ours (then fails its foreign key: it never survives as a row of a deleted
-- user).
SELECT id FROM public."user" WHERE id = :user_id FOR UPDATE
""",
)

STILL_ORPHAN = _chassis(
    "still_orphan",
    f"""
-- orphan-user-purge re-check under every lock above, as its own statement so its snapshot is
-- taken after the waits (a FOR UPDATE re-reads only the locked row, never its subqueries): the
-- whole orphan rule again for user user_id, on the locked row as committed.
SELECT EXISTS (SELECT 1 FROM public."user" u WHERE u.id = :user_id AND {_ORPHAN_RULE})
""",
)

DELETE_USER = _chassis(
    "delete_user",
    """
-- orphan-user-purge: the whole user; its sessions, accounts and memberships go by cascade.
DELETE FROM public."user" WHERE id = :user_id
""",
)

AUDIT_ORPHAN_PURGE = _chassis(
    "audit_orphan_purge",
    """
-- orphan-user-purge: the run's one instance-level system row, inserted in the transaction of
-- the run's first deletion, stamped with the run's clock.
INSERT INTO public.audit_log
    (workspace_id, actor_via, principal, action, resource_type, resource_id, metadata, created_at)
VALUES (NULL, 'system', NULL, 'user.orphan_purge', 'user', NULL, :metadata::jsonb,
        :now::timestamptz)
RETURNING id
""",
)

UPDATE_ORPHAN_AUDIT = _chassis(
    "update_orphan_audit",
    """
-- orphan-user-purge: the run's audit row, updated in the transaction of each later deletion, so
-- its count and sample match the deletions exactly even if the run dies half-way.
UPDATE public.audit_log SET metadata = :metadata::jsonb WHERE id = :row_id
""",
)

RECORD_RUN = Query(
    "record_run",
    """
-- purge run record for `chassis-worker queues`; the queue's records older than 90 days go.
WITH gone AS (
    DELETE FROM {s}.purge_run
    WHERE queue = :queue AND started_at < :started_at::timestamptz - interval '90 days'
)
INSERT INTO {s}.purge_run (queue, job_id, started_at, deleted, drained, details)
VALUES (:queue, :job_id, :started_at, :deleted, :drained, :details::jsonb)
""",
)

LAST_RUNS = Query(
    "last_runs",
    """
-- the newest run of each purge queue (index purge_run_latest).
SELECT DISTINCT ON (queue) queue, started_at, finished_at, deleted, drained
FROM {s}.purge_run
ORDER BY queue, started_at DESC
""",
)

HAS_RUN_TABLE = _chassis(
    "has_run_table",
    """
-- whether the database has the purge run record yet (an older release may not).
SELECT to_regclass(:table) IS NOT NULL
""",
)


def record_run(schema: str) -> Rendered:
    """:data:`RECORD_RUN` for the queue schema ``schema``."""
    return RECORD_RUN.render(schema)


def last_runs(schema: str) -> Rendered:
    """:data:`LAST_RUNS` for the queue schema ``schema``."""
    return LAST_RUNS.render(schema)


def run_table(schema: str) -> str:
    """The qualified name of the run record table, for :data:`HAS_RUN_TABLE`."""
    return f"{quoted(schema)}.purge_run"
