-- Issue 28: the api role gets no right on the install's bookkeeping (schema_migration, install)
-- or on the schedules, and every function of the queue schema resolves names with a search_path
-- of its own.
--
-- 1. What the api role reads of those tables it reads through two views. A view reads its tables
--    with its owner's rights (the install's role, which owns everything here), so
--    config/roles.sql grants SELECT on the views and nothing on the tables behind them:
--    install_state for the api process's readiness (the newest migration and the install's
--    completion: worker/boot.py), queue_schedule for the queues document (a queue's cron and
--    last run: COUNTS in worker/queue/sql.py). A view's names are bound when it is created, so no
--    caller's search_path can change what it reads (a SECURITY DEFINER function would be the
--    other way, and would need a pinned search_path of its own).

CREATE VIEW install_state AS
SELECT (SELECT max(m.version) FROM schema_migration AS m) AS version,
       (SELECT i.completed_at FROM install AS i WHERE i.id = 1) AS installed_at;

CREATE VIEW queue_schedule AS
SELECT s.queue, s.cron, s.last_run FROM schedule AS s;

-- 2. The functions of 0005, 0007 and 0008 call built-ins (pg_notify, make_timestamp, power,
--    operators such as numeric < integer) by unqualified name. Without a search_path of their
--    own (0007, 0008) they resolve those names on the caller's path, and 0005's
--    `SET search_path FROM CURRENT` put public on theirs (the runner's "<schema>, public"). A
--    role that may CREATE in public (every role on PostgreSQL 14 and older unless revoked) can
--    plant a look-alike there that matches a call's argument types better than pg_catalog's
--    implicit-cast candidate (make_timestamp(int, ..., numeric) in emit_usage's occurred_at),
--    or equally well for a caller whose path names public before pg_catalog (pg_notify in
--    send): it then runs inside the function with the caller's rights (CVE-2018-1058).
--    Every function (and procedure) of the queue schema, including any a superuser or
--    config/roles.sql left here, now searches pg_catalog first, then this schema, then pg_temp
--    last (so a temporary table can never shadow one of ours). current_schema() is the queue
--    schema: the runner sets the search_path to it while a migration runs.
--
--    The price: a SET clause is a configuration save and restore per call, and on PostgreSQL 15
--    each change of search_path makes the next statements recompute the path. Measured on this
--    project's 2-core machine (server-side loops of 20,000 calls, the backend's CPU time, runs
--    of old and pinned functions interleaved, medians of 3 to 5 runs, other tests running):
--    a pinned no-op function costs 3.5 to 4.5 us more a call than a plain one; SELECT
--    jobs.send('q', data) 2 to 5 us more (+3 to +8%); a send with an option (start_after),
--    which also calls _send_due, about 20 us more (+35%); emit_usage, which calls eight
--    helpers that each pin their own, 40 to 60 us more (+12 to +16%). The functions of 0005
--    (the job_count triggers) already had a SET clause and pay nothing more. Worth it: a send
--    that can run someone else's code with the caller's rights is not one to offer every
--    client. Aggregates and window functions cannot take a SET clause; the schema has none.

DO $pin$
DECLARE
    routine regprocedure;
BEGIN
    FOR routine IN
        SELECT p.oid FROM pg_catalog.pg_proc AS p
        WHERE p.pronamespace = (SELECT n.oid FROM pg_catalog.pg_namespace AS n
                                WHERE n.nspname = pg_catalog.current_schema())
          AND p.prokind IN ('f', 'p')
        ORDER BY p.oid
    LOOP
        EXECUTE pg_catalog.format('ALTER ROUTINE %s SET search_path = pg_catalog, %I, pg_temp',
                                  routine, pg_catalog.current_schema());
    END LOOP;
END
$pin$;
