-- The chassis tables the nightly purges act on (contract section 8), and the purge run record.
--
-- The chassis tables live in public whatever JOBS_SCHEMA is, so every one of their names is
-- qualified. Each is created only when absent: an app that already has the table keeps its own
-- shape, and only the indexes the purges need are added to it (see the end of this file).
-- purge_run is unqualified and lands in the queue schema (the runner's search_path).

-- The migration lock is per queue schema, but public is shared: two daemons with different
-- JOBS_SCHEMA migrating one database at once would race on these CREATEs. This transaction lock
-- serialises them; the second then finds every table and index in place.
SELECT pg_advisory_xact_lock(hashtextextended('chassis-worker:public-chassis-tables', 0));

CREATE TABLE IF NOT EXISTS public."user" (
    id             text PRIMARY KEY,
    email          text NOT NULL UNIQUE,
    email_verified boolean NOT NULL DEFAULT false,
    name           text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- Sessions, accounts and memberships go with their user (ON DELETE CASCADE): deleting the user
-- row is the one way the orphan purge removes anything, so a cleanup is never partial.
CREATE TABLE IF NOT EXISTS public.session (
    id         text PRIMARY KEY,
    user_id    text NOT NULL REFERENCES public."user" (id) ON DELETE CASCADE,
    token      text NOT NULL UNIQUE,
    expires_at timestamptz NOT NULL,
    ip_address text,
    user_agent text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS public.account (
    id          text PRIMARY KEY,
    user_id     text NOT NULL REFERENCES public."user" (id) ON DELETE CASCADE,
    provider_id text NOT NULL,
    account_id  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (provider_id, account_id)
);

CREATE TABLE IF NOT EXISTS public.workspace_members (
    workspace_id   text NOT NULL,
    user_id        text NOT NULL REFERENCES public."user" (id) ON DELETE CASCADE,
    role           text NOT NULL,
    origin         text NOT NULL DEFAULT 'local',
    deactivated_at timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, user_id)
);

CREATE TABLE IF NOT EXISTS public.invitations (
    id           text PRIMARY KEY,
    workspace_id text NOT NULL,
    email        text NOT NULL,
    role         text NOT NULL DEFAULT 'member',
    expires_at   timestamptz NOT NULL,
    accepted_at  timestamptz,
    revoked_at   timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- A single row (id = 1). The row itself is the app's to write: inserting it here would fail on
-- an app table with more required columns.
CREATE TABLE IF NOT EXISTS public.instance_settings (
    id               integer PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    operator_user_id text REFERENCES public."user" (id) ON DELETE SET NULL,
    updated_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS public.audit_log (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- NULL for instance-level rows (the orphan purge writes one per run that deleted any).
    workspace_id  text,
    actor_via     text NOT NULL,
    principal     text,
    action        text NOT NULL,
    resource_type text NOT NULL,
    resource_id   text,
    metadata      jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS public.api_keys (
    id           text PRIMARY KEY,
    workspace_id text NOT NULL,
    name         text NOT NULL,
    key_hash     text NOT NULL UNIQUE,
    expires_at   timestamptz,
    revoked_at   timestamptz,
    last_used_at timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS public.idempotency_keys (
    workspace_id text NOT NULL,
    key          text NOT NULL,
    response     jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (workspace_id, key)
);

-- The indexes the purges depend on. Each is created only when the table has no valid index
-- leading with the same key already: an app that brought its own audit_log(created_at) index
-- under another name does not get a second copy of a possibly huge index. On an app's table this
-- role does not own, a missing index is reported, not created: only the owner may create it, and
-- failing the whole migration would keep every worker from starting over a slower purge.
DO $$
DECLARE
    wanted record;
BEGIN
    FOR wanted IN
        SELECT * FROM (VALUES
            -- audit-purge: oldest rows first, a batch at a time.
            ('public.audit_log', 'created_at',
             'CREATE INDEX audit_log_created_at_idx ON public.audit_log (created_at)'),
            -- idempotency-purge: rows past expires_at.
            ('public.idempotency_keys', 'expires_at',
             'CREATE INDEX idempotency_keys_expires_at_idx ON public.idempotency_keys (expires_at)'),
            -- apikey-expiry-sweep: only unrevoked keys with an expiry are ever candidates.
            ('public.api_keys', 'expires_at',
             'CREATE INDEX api_keys_expires_at_idx ON public.api_keys (expires_at) '
             'WHERE revoked_at IS NULL AND expires_at IS NOT NULL'),
            -- orphan-user-purge: "has a live session" per user, and the cascade on delete.
            ('public.session', 'user_id',
             'CREATE INDEX session_user_id_expires_at_idx ON public.session (user_id, expires_at)'),
            ('public.account', 'user_id',
             'CREATE INDEX account_user_id_idx ON public.account (user_id)'),
            -- orphan-user-purge: "has any membership" per user (the primary key leads with the
            -- workspace), and the cascade on delete.
            ('public.workspace_members', 'user_id',
             'CREATE INDEX workspace_members_user_id_idx ON public.workspace_members (user_id)'),
            -- orphan-user-purge: a live invitation matches the email case-insensitively.
            ('public.invitations', 'lower(email)',
             'CREATE INDEX invitations_lower_email_idx ON public.invitations (lower(email))')
        ) AS w (tbl, lead, ddl)
    LOOP
        IF EXISTS (
            SELECT 1 FROM pg_index i
            WHERE i.indrelid = wanted.tbl::regclass
              AND i.indisvalid
              AND pg_get_indexdef(i.indexrelid, 1, true) = wanted.lead
        ) THEN
            CONTINUE;
        END IF;
        IF pg_has_role(
            current_user,
            (SELECT relowner FROM pg_class WHERE oid = wanted.tbl::regclass),
            'USAGE'
        ) THEN
            EXECUTE wanted.ddl;
        ELSE
            RAISE WARNING 'chassis-worker: % has no index leading with %, so its purge scans '
                'the table; as its owner, run: %', wanted.tbl, wanted.lead, wanted.ddl;
        END IF;
    END LOOP;
END
$$;

-- One row per finished purge run, so `chassis-worker queues` can say when each purge last ran.
-- Four rows a night; each run removes its queue's rows older than 90 days.
CREATE TABLE purge_run (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue       text NOT NULL,
    job_id      bigint,
    -- The run's one clock: the database's now() read at the start of the run.
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    deleted     bigint NOT NULL CHECK (deleted >= 0),
    -- Whether the run reached the end of its tail (false: stopped by its batch cap or time budget).
    drained     boolean NOT NULL DEFAULT true,
    details     jsonb NOT NULL DEFAULT '{}'::jsonb
);

CREATE INDEX purge_run_latest ON purge_run (queue, started_at DESC);
