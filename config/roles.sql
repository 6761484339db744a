-- chassis-worker: least-privilege database roles.
--
--   api role     (SERVICE_ROLE=api, and apps using api_sender): enqueue, and cancel, resume,
--                retry and pause (contract section 10). CONNECT, USAGE on the queue schema,
--                SELECT/INSERT/UPDATE on its tables and USAGE on its sequences, current and
--                future; INSERT on public.audit_log. No CREATE anywhere, no DELETE (so no job
--                delete or queue purge), no TRUNCATE, no DDL.
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
-- Idempotent: run it again at any time, and after every upgrade (a new migration's tables get the
-- api grants through default privileges already; a re-run also hands the worker role anything a
-- superuser created in the queue schema). Roles are cluster-wide: the same two roles may serve
-- several databases, one run per database. On PostgreSQL 14 and older, PUBLIC may CREATE in
-- schema public unless you revoked it; this file does not touch PUBLIC's rights.

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
-- and the default privileges below can name it before the first install.
SELECT format('CREATE SCHEMA %I AUTHORIZATION %I', :'jobs_schema', :'worker_role')
WHERE NOT EXISTS (SELECT FROM pg_namespace WHERE nspname = :'jobs_schema') \gexec

-- psql variables do not reach inside a DO block; session settings do.
SET chassis.jobs_schema TO :'jobs_schema';
SET chassis.worker_role TO :'worker_role';
SET chassis.api_role TO :'api_role';

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

-- The api role: enqueue into the queue schema, nothing more. Default privileges cover the tables
-- a later install or migration creates (as the worker role) without a re-run of this file.
GRANT USAGE ON SCHEMA :"jobs_schema" TO :"api_role";
REVOKE CREATE ON SCHEMA :"jobs_schema" FROM :"api_role";
GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA :"jobs_schema" TO :"api_role";
REVOKE DELETE, TRUNCATE, REFERENCES, TRIGGER ON ALL TABLES IN SCHEMA :"jobs_schema"
    FROM :"api_role";
GRANT USAGE ON ALL SEQUENCES IN SCHEMA :"jobs_schema" TO :"api_role";
ALTER DEFAULT PRIVILEGES FOR ROLE :"worker_role" IN SCHEMA :"jobs_schema"
    GRANT SELECT, INSERT, UPDATE ON TABLES TO :"api_role";
ALTER DEFAULT PRIVILEGES FOR ROLE :"worker_role" IN SCHEMA :"jobs_schema"
    GRANT USAGE ON SEQUENCES TO :"api_role";
-- The enqueue functions of migration 0007 (contract section 11: send, send_many, emit_usage,
-- schedule_timer, cancel_timer and the helpers they call). SECURITY INVOKER: they run with the
-- api role's own rights, so EXECUTE adds no power beyond the grants above. Default privileges
-- cover an install after this run.
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA :"jobs_schema" TO :"api_role";
ALTER DEFAULT PRIVILEGES FOR ROLE :"worker_role" IN SCHEMA :"jobs_schema"
    GRANT EXECUTE ON FUNCTIONS TO :"api_role";

-- The worker role in schema public: create the chassis tables when absent (migration 0002), and
-- read and write the ones an app already owns (the purges delete, the key sweep updates, the
-- orphan purge writes an audit row). An app-owned table keeps its owner; if it lacks an index the
-- purges need, the migration cannot add it as this role: create that index as the table's owner.
--
-- The api role's job and queue actions (contract section 10: cancel, resume, retry, pause) each
-- write one audit row in their own statement: INSERT on public.audit_log (and the sequence of a
-- serial id), nothing more (it can neither read nor change the log). Deleting jobs and purging
-- queues need DELETE, which only the worker role has. Re-run this file once the install has
-- created audit_log.
GRANT USAGE, CREATE ON SCHEMA public TO :"worker_role";
DO $chassis$
DECLARE
    w text := current_setting('chassis.worker_role');
    api text := current_setting('chassis.api_role');
    t text;
    seq text;
BEGIN
    FOREACH t IN ARRAY ARRAY['user', 'session', 'account', 'workspace_members', 'invitations',
                             'instance_settings', 'audit_log', 'api_keys', 'idempotency_keys']
    LOOP
        CONTINUE WHEN to_regclass(format('public.%I', t)) IS NULL;
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON public.%I TO %I', t, w);
        IF t = 'audit_log' THEN
            EXECUTE format('GRANT INSERT ON public.audit_log TO %I', api);
        END IF;
        -- The id sequence of a serial (not identity) column needs its own grant.
        FOR seq IN
            SELECT pg_get_serial_sequence(format('public.%I', t), a.attname)
            FROM pg_attribute a
            WHERE a.attrelid = format('public.%I', t)::regclass AND a.attnum > 0
              AND NOT a.attisdropped
        LOOP
            CONTINUE WHEN seq IS NULL;
            EXECUTE format('GRANT USAGE, SELECT ON SEQUENCE %s TO %I', seq, w);
            IF t = 'audit_log' THEN
                EXECUTE format('GRANT USAGE ON SEQUENCE %s TO %I', seq, api);
            END IF;
        END LOOP;
    END LOOP;
END
$chassis$;

RESET chassis.api_role;
RESET chassis.jobs_schema;
RESET chassis.worker_role;

\echo roles.sql: :api_role and :worker_role are set up in database :dbname (schema :jobs_schema)
