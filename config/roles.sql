-- chassis-worker: least-privilege database roles.
--
--   api role     (SERVICE_ROLE=api, and apps using api_sender): enqueue, and cancel, resume,
--                retry and pause (contract section 10). CONNECT, USAGE on the queue schema, and
--                per table, per column where it writes, exactly what its code paths need (the
--                `decided` list of grant_api_role below gives each table's decision and why):
--                it reads the queue and job tables and sends through the functions of
--                migrations 0007/0008 (EXECUTE; SECURITY INVOKER, so they add no power), which
--                insert a job's send columns; it updates a job's state, times, fence, retry limit
--                and output (the actions, timers, held redrive and discard) and a queue's
--                `paused` (and its updated_at), never a queue's policy, retry or dead-letter
--                columns; it writes the job_count counters (their triggers run as whoever
--                updates job) and the console's per-minute tally, reads the purge runs, and
--                reads the install state and the schedules only through the views install_state
--                and queue_schedule (migration 0009); INSERT on public.audit_log's columns but
--                its id and created_at. Nothing on schema_migration, install, schedule, worker; no
--                CREATE anywhere, no DELETE (so no job delete or queue purge), no TRUNCATE, no
--                DDL, and no default privileges: a table added later gets nothing until this
--                file has a decision for it.
--   worker role  (SERVICE_ROLE=worker|all, `chassis-worker migrate`, `held`, `queues`): runs the
--                install and the purges. Owner of the queue schema and of everything in it,
--                CREATE on the database and on schema public (the migrations create the chassis
--                tables there when absent), SELECT/INSERT/UPDATE/DELETE on the chassis tables an
--                app already owns.
--
-- Run it as a superuser (or as a CREATEROLE role that owns the database and is a member of both
-- roles), with psql, in or for the daemon's database:
--
--   psql "postgresql://postgres@db-host/chassis" -v ON_ERROR_STOP=1 \
--        -v api_password="$CHASSIS_API_PASSWORD" -v worker_password="$CHASSIS_WORKER_PASSWORD" \
--        -f config/roles.sql
--
-- psql variables (-v name=value), all optional:
--   api_role         [chassis_api]     name of the enqueue-only role
--   worker_role      [chassis_worker]  name of the install-and-purge role
--   api_password     [unchanged]       sets the api role's password (a new role without one can
--                                      log in only by trust, peer or certificate)
--   worker_password  [unchanged]       sets the worker role's password
--   jobs_schema      [jobs]            the daemons' JOBS_SCHEMA
--   dbname           [current]         the database to set up; psql reconnects to it when given
--
-- Idempotent: run it again at any time, and after every upgrade (a re-run brings the api role's
-- rights to this file's decisions, taking back what an older release granted, and hands the
-- worker role anything a superuser created in the queue schema). It may run before the first
-- install: it leaves the function grant_api_role in the queue schema, which every install calls
-- after its migrations, so the tables an install creates get their grants at once. Roles are
-- cluster-wide: the same two roles may serve several databases, one run per database. On
-- PostgreSQL 14 and older, PUBLIC may CREATE in schema public unless you revoked it; this file
-- does not touch PUBLIC's rights (the queue schema's functions pin their search_path, migration
-- 0009, so nothing planted in public runs inside them).

\set ON_ERROR_STOP on

\if :{?api_role}
\else
  \set api_role chassis_api
\endif
\if :{?worker_role}
\else
  \set worker_role chassis_worker
\endif
\if :{?jobs_schema}
\else
  \set jobs_schema jobs
\endif
\if :{?dbname}
  \connect :"dbname"
\endif

SELECT current_database() AS dbname \gset

-- The roles: created when absent, then (re)set to plain login roles with no special powers.
SELECT format('CREATE ROLE %I LOGIN', :'api_role')
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'api_role') \gexec
SELECT format('CREATE ROLE %I LOGIN', :'worker_role')
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'worker_role') \gexec

ALTER ROLE :"api_role" WITH LOGIN INHERIT NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION
    NOBYPASSRLS;
ALTER ROLE :"worker_role" WITH LOGIN INHERIT NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION
    NOBYPASSRLS;

\if :{?api_password}
ALTER ROLE :"api_role" WITH PASSWORD :'api_password';
\endif
\if :{?worker_password}
ALTER ROLE :"worker_role" WITH PASSWORD :'worker_password';
\endif

-- The database: both connect; only the worker may create a schema (the install's
-- CREATE SCHEMA IF NOT EXISTS, and any other JOBS_SCHEMA it is pointed at).
GRANT CONNECT ON DATABASE :"dbname" TO :"api_role", :"worker_role";
GRANT CREATE ON DATABASE :"dbname" TO :"worker_role";
REVOKE CREATE ON DATABASE :"dbname" FROM :"api_role";

-- The queue schema, created here when absent so it belongs to the worker role from the start
-- and grant_api_role (below) can live in it before the first install.
SELECT format('CREATE SCHEMA %I AUTHORIZATION %I', :'jobs_schema', :'worker_role')
WHERE NOT EXISTS (SELECT FROM pg_namespace WHERE nspname = :'jobs_schema') \gexec

-- psql variables do not reach inside a DO block; session settings do.
SET chassis.jobs_schema TO :'jobs_schema';
SET chassis.worker_role TO :'worker_role';
SET chassis.api_role TO :'api_role';

-- The api role's rights, as a function the install can run. It lives in the queue schema, owned
-- by the worker role (below), and runs as its caller (SECURITY INVOKER): the worker role's
-- install calls it after every migration run (worker/install.py), which is how the tables an
-- install creates after this file ran get their grants without default privileges; this file
-- calls it at its end. Nobody else may execute it.
--
-- For every table, view and sequence of the queue schema and the chassis tables of public it
-- compares the api role's privileges with `decided` and, only where they differ, revokes all of
-- them and grants the decided ones (so a boot that finds them right writes nothing, and a
-- database an older release set up loses what it no longer needs). A relation the caller does
-- not own (an app's audit_log, seen by the worker role) is left to a run of this file as a
-- superuser. A table or view with no entry in `decided` gets nothing, with a warning: adding a
-- table means adding its decision here (tests/deploy/test_roles.py holds the same list and
-- fails on a table that has none). A sequence gets USAGE when it feeds a serial column the api
-- role may insert (an identity column, as every chassis id is, needs no right on its sequence).
-- EXECUTE goes to every SECURITY INVOKER function of the queue schema (they run with the
-- caller's rights, so EXECUTE adds no power); a SECURITY DEFINER one would need a decision.
DO $grants$
DECLARE
    body text;
BEGIN
body := $sql$
CREATE OR REPLACE FUNCTION @s@.grant_api_role() RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    schema_name CONSTANT text := @schema_literal@;
    api_name    CONSTANT text := @api_literal@;
    -- Per relation (a name of the queue schema, or public.<name>), per privilege: true for the
    -- whole relation, or the columns it covers; {} for nothing at all.
    decided CONSTANT jsonb := jsonb_build_object(
        -- Sends read a queue's policy and retry defaults (the functions read the whole row);
        -- queues.pause/resume write the flag and its updated_at. Never the policy, retry,
        -- expiry, retention or dead-letter columns: no role that enqueues may decide whether
        -- a usage event is retried or dead-lettered.
        'queue', '{"SELECT": true, "UPDATE": ["paused", "updated_at"]}'::jsonb,
        -- Sends insert waiting jobs: the state, attempt, fence and times take their defaults.
        -- cancel, resume, retry, the timers' replace and cancel, and the held redrive and
        -- discard update a job's state, times, fence (locked_by cleared), retry limit (one
        -- more attempt) and output (who discarded). The admin API and the console read jobs.
        'job', '{"SELECT": true,
                 "INSERT": ["queue", "policy", "data", "priority", "singleton_key", "is_timer",
                            "retry_limit", "retry_delay", "retry_backoff", "expire_seconds",
                            "start_after"],
                 "UPDATE": ["state", "start_after", "started_at", "completed_at", "locked_by",
                            "retry_limit", "output"]}'::jsonb,
        -- The counters of migration 0005: their triggers run with the rights of whoever
        -- updates job (an action, a timer cancel); the queues document reads them.
        'job_count', '{"SELECT": true, "INSERT": true, "UPDATE": ["n"]}'::jsonb,
        -- The console tallies the chart's minutes itself when no worker has lately.
        'job_minute', '{"SELECT": true, "INSERT": true, "UPDATE": ["completed", "failed"]}'::jsonb,
        -- The queues document shows each purge queue's last run.
        'purge_run', '{"SELECT": true}'::jsonb,
        -- Views of migration 0009, read with their owner's rights: the api process's readiness
        -- (newest migration, install done) and the queues document's cron and last run.
        'install_state', '{"SELECT": true}'::jsonb,
        'queue_schedule', '{"SELECT": true}'::jsonb,
        -- The install's and the workers' own: a row here could stop every migrate, fire or
        -- silence a schedule, or fake a live worker.
        'schema_migration', '{}'::jsonb,
        'install', '{}'::jsonb,
        'schedule', '{}'::jsonb,
        'worker', '{}'::jsonb,
        -- Each job and queue action writes one audit row in its own statement: the row's own
        -- columns, not its id or created_at (no backdated row for the audit purge to take), and
        -- no SELECT (it can neither read nor change the log).
        'public.audit_log', '{"INSERT": ["workspace_id", "actor_via", "principal", "action",
                                         "resource_type", "resource_id", "metadata"]}'::jsonb,
        -- The app's tables the purges clean: nothing.
        'public.user', '{}'::jsonb,
        'public.session', '{}'::jsonb,
        'public.account', '{}'::jsonb,
        'public.workspace_members', '{}'::jsonb,
        'public.invitations', '{}'::jsonb,
        'public.instance_settings', '{}'::jsonb,
        'public.api_keys', '{}'::jsonb,
        'public.idempotency_keys', '{}'::jsonb);
    api  oid := (SELECT r.oid FROM pg_roles AS r WHERE r.rolname = api_name);
    ns   oid := (SELECT n.oid FROM pg_namespace AS n WHERE n.nspname = schema_name);
    r    record;
    p    record;
    want text[];
    have text[];
    cols text;
BEGIN
    IF api IS NULL OR ns IS NULL THEN
        RAISE WARNING 'grant_api_role: role % or schema % does not exist; nothing granted',
            quote_ident(api_name), quote_ident(schema_name);
        RETURN;
    END IF;
    FOR r IN
        SELECT c.oid, c.oid::regclass AS rel, c.relkind, c.relowner, c.relacl,
               CASE WHEN c.relnamespace = ns THEN c.relname ELSE 'public.' || c.relname END AS key,
               d.deptype AS fed_by, t.oid AS fed, d.refobjsubid AS fed_column,
               CASE WHEN t.relnamespace = ns THEN t.relname ELSE 'public.' || t.relname END
                   AS fed_key
        FROM pg_class AS c
        -- A sequence's table and column: serial ('a') or identity ('i').
        LEFT JOIN pg_depend AS d
               ON c.relkind = 'S' AND d.classid = 'pg_class'::regclass AND d.objid = c.oid
              AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')
        LEFT JOIN pg_class AS t ON t.oid = d.refobjid
        WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
          AND (c.relnamespace = ns
               OR (c.relnamespace = 'public'::regnamespace
                   AND (decided ? ('public.' || c.relname)
                        OR (t.relnamespace = 'public'::regnamespace
                            AND decided ? ('public.' || t.relname)))))
        ORDER BY c.oid
    LOOP
        IF r.relkind = 'S' THEN
            SELECT CASE WHEN r.fed_by = 'a'
                         AND (i.ins = 'true'::jsonb OR (jsonb_typeof(i.ins) = 'array'
                                                        AND i.ins ? a.attname))
                        THEN '{USAGE}'::text[] ELSE '{}'::text[] END
            INTO want
            FROM (SELECT decided -> r.fed_key -> 'INSERT' AS ins) AS i
            LEFT JOIN pg_attribute AS a ON a.attrelid = r.fed AND a.attnum = r.fed_column;
        ELSE
            IF NOT decided ? r.key THEN
                RAISE WARNING 'grant_api_role: no decision for % in config/roles.sql', r.rel
                    USING DETAIL = 'The api role gets nothing on it.';
            END IF;
            SELECT COALESCE(array_agg(DISTINCT w.g ORDER BY w.g), '{}') INTO want FROM (
                SELECT e.key AS g FROM jsonb_each(decided -> r.key) AS e
                WHERE e.value = 'true'::jsonb
                UNION ALL
                SELECT e.key || '(' || a.attname || ')'
                FROM jsonb_each(decided -> r.key) AS e
                JOIN pg_attribute AS a
                  ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
                 AND jsonb_typeof(e.value) = 'array' AND e.value ? a.attname) AS w;
        END IF;
        SELECT COALESCE(array_agg(DISTINCT h.g ORDER BY h.g), '{}') INTO have FROM (
            SELECT x.privilege_type AS g FROM aclexplode(r.relacl) AS x WHERE x.grantee = api
            UNION ALL
            SELECT x.privilege_type || '(' || a.attname || ')'
            FROM pg_attribute AS a CROSS JOIN LATERAL aclexplode(a.attacl) AS x
            WHERE a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
              AND x.grantee = api) AS h;
        CONTINUE WHEN want = have;
        IF NOT pg_has_role(current_user, r.relowner, 'USAGE') THEN
            RAISE NOTICE 'grant_api_role: % belongs to %, not to %', r.rel,
                    pg_get_userbyid(r.relowner), current_user
                USING HINT = 'Run config/roles.sql as a superuser to set the api role''s rights.';
            CONTINUE;
        END IF;
        -- Revoking a table's privileges revokes its column privileges too.
        EXECUTE format('REVOKE ALL ON %s %s FROM %I',
                       CASE WHEN r.relkind = 'S' THEN 'SEQUENCE' ELSE 'TABLE' END, r.rel, api_name);
        IF r.relkind = 'S' THEN
            IF cardinality(want) > 0 THEN
                EXECUTE format('GRANT USAGE ON SEQUENCE %s TO %I', r.rel, api_name);
            END IF;
            CONTINUE;
        END IF;
        FOR p IN SELECT e.key AS privilege, e.value FROM jsonb_each(decided -> r.key) AS e LOOP
            IF p.value = 'true'::jsonb THEN
                EXECUTE format('GRANT %s ON TABLE %s TO %I', p.privilege, r.rel, api_name);
                CONTINUE;
            END IF;
            SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO cols
            FROM pg_attribute AS a
            WHERE a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
              AND p.value ? a.attname;
            IF cols IS NOT NULL THEN
                EXECUTE format('GRANT %s (%s) ON TABLE %s TO %I', p.privilege, cols, r.rel,
                               api_name);
            END IF;
        END LOOP;
    END LOOP;
    FOR p IN
        SELECT f.oid::regprocedure AS routine, f.prosecdef FROM pg_proc AS f
        WHERE f.pronamespace = ns AND f.prokind IN ('f', 'p')
          AND NOT (f.proname = 'grant_api_role' AND f.pronargs = 0)
          AND pg_has_role(current_user, f.proowner, 'USAGE')
          AND NOT EXISTS (SELECT FROM aclexplode(f.proacl) AS x
                          WHERE x.grantee = api AND x.privilege_type = 'EXECUTE')
        ORDER BY f.oid
    LOOP
        IF p.prosecdef THEN
            RAISE WARNING 'grant_api_role: % is SECURITY DEFINER', p.routine
                USING DETAIL = 'config/roles.sql has no decision for it: no EXECUTE for the api role.';
            CONTINUE;
        END IF;
        EXECUTE format('GRANT EXECUTE ON ROUTINE %s TO %I', p.routine, api_name);
    END LOOP;
END
$fn$;
$sql$;
    body := replace(body, '@schema_literal@', quote_literal(current_setting('chassis.jobs_schema')));
    body := replace(body, '@api_literal@', quote_literal(current_setting('chassis.api_role')));
    body := replace(body, '@s@', quote_ident(current_setting('chassis.jobs_schema')));
    EXECUTE body;
END
$grants$;

-- Hand the schema and everything in it to the worker role: a database migrated by a superuser
-- before the roles existed keeps working, and later migrations (run as the worker) may alter it.
DO $roles$
DECLARE
    s     text := current_setting('chassis.jobs_schema');
    w     text := current_setting('chassis.worker_role');
    ns    oid  := (SELECT oid FROM pg_namespace WHERE nspname = s);
    owner_oid oid := (SELECT oid FROM pg_roles WHERE rolname = w);
    r     record;
BEGIN
    EXECUTE format('ALTER SCHEMA %I OWNER TO %I', s, w);
    -- Tables, views and foreign tables (their identity and serial sequences follow them).
    FOR r IN
        SELECT c.relname, c.relkind FROM pg_class c
        WHERE c.relnamespace = ns AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
          AND c.relowner <> owner_oid
    LOOP
        EXECUTE format(
            'ALTER %s %I.%I OWNER TO %I',
            CASE r.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                           WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END,
            s, r.relname, w);
    END LOOP;
    -- Free-standing sequences (not owned by a column).
    FOR r IN
        SELECT c.relname FROM pg_class c
        WHERE c.relnamespace = ns AND c.relkind = 'S' AND c.relowner <> owner_oid
          AND NOT EXISTS (
              SELECT FROM pg_depend d
              WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i'))
    LOOP
        EXECUTE format('ALTER SEQUENCE %I.%I OWNER TO %I', s, r.relname, w);
    END LOOP;
    -- Enums, domains, ranges and free-standing composite types (the job_state enum).
    FOR r IN
        SELECT t.typname, t.typtype FROM pg_type t
        LEFT JOIN pg_class c ON c.oid = t.typrelid
        WHERE t.typnamespace = ns AND t.typowner <> owner_oid
          AND (t.typtype IN ('e', 'd', 'r') OR (t.typtype = 'c' AND c.relkind = 'c'))
    LOOP
        EXECUTE format('ALTER %s %I.%I OWNER TO %I',
                       CASE r.typtype WHEN 'd' THEN 'DOMAIN' ELSE 'TYPE' END, s, r.typname, w);
    END LOOP;
    -- Functions, procedures and aggregates.
    FOR r IN
        SELECT p.oid::regprocedure AS routine FROM pg_proc p
        WHERE p.pronamespace = ns AND p.proowner <> owner_oid
    LOOP
        EXECUTE format('ALTER ROUTINE %s OWNER TO %I', r.routine, w);
    END LOOP;
END
$roles$;

-- The api role in the queue schema: USAGE, no CREATE, and the decided grants (grant_api_role,
-- run at the end of this file). Default privileges that an older release gave it on whatever
-- the worker role creates there are taken back: a table must have a decision first.
GRANT USAGE ON SCHEMA :"jobs_schema" TO :"api_role";
REVOKE CREATE ON SCHEMA :"jobs_schema" FROM :"api_role";
ALTER DEFAULT PRIVILEGES FOR ROLE :"worker_role" IN SCHEMA :"jobs_schema"
    REVOKE ALL ON TABLES FROM :"api_role";
ALTER DEFAULT PRIVILEGES FOR ROLE :"worker_role" IN SCHEMA :"jobs_schema"
    REVOKE ALL ON SEQUENCES FROM :"api_role";
ALTER DEFAULT PRIVILEGES FOR ROLE :"worker_role" IN SCHEMA :"jobs_schema"
    REVOKE ALL ON FUNCTIONS FROM :"api_role";
-- Only the owner (the install) and this file run grant_api_role.
REVOKE ALL ON FUNCTION :"jobs_schema".grant_api_role() FROM PUBLIC;

-- The worker role in schema public: create the chassis tables when absent (migration 0002), and
-- read and write the ones an app already owns (the purges delete, the key sweep updates, the
-- orphan purge writes an audit row). An app-owned table keeps its owner; if it lacks an index the
-- purges need, the migration cannot add it as this role: create that index as the table's owner.
-- (The api role's INSERT on audit_log is one of grant_api_role's decisions; on an app-owned
-- audit_log only this file, run as a superuser, can make it.)
GRANT USAGE, CREATE ON SCHEMA public TO :"worker_role";
DO $chassis$
DECLARE
    w text := current_setting('chassis.worker_role');
    t text;
    seq text;
BEGIN
    FOREACH t IN ARRAY ARRAY['user', 'session', 'account', 'workspace_members', 'invitations',
                             'instance_settings', 'audit_log', 'api_keys', 'idempotency_keys']
    LOOP
        CONTINUE WHEN to_regclass(format('public.%I', t)) IS NULL;
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON public.%I TO %I', t, w);
        -- The id sequence of a serial (not identity) column needs its own grant.
        FOR seq IN
            SELECT pg_get_serial_sequence(format('public.%I', t), a.attname)
            FROM pg_attribute a
            WHERE a.attrelid = format('public.%I', t)::regclass AND a.attnum > 0
              AND NOT a.attisdropped
        LOOP
            CONTINUE WHEN seq IS NULL;
            EXECUTE format('GRANT USAGE, SELECT ON SEQUENCE %s TO %I', seq, w);
        END LOOP;
    END LOOP;
END
$chassis$;

-- The api role's decided rights on every table, view, sequence and function there is now.
DO $apply$
BEGIN
    EXECUTE format('SELECT %I.grant_api_role()', current_setting('chassis.jobs_schema'));
END
$apply$;

RESET chassis.api_role;
RESET chassis.jobs_schema;
RESET chassis.worker_role;

\echo roles.sql: :api_role and :worker_role are set up in database :dbname (schema :jobs_schema)
