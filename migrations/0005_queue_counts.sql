-- Exact counts of finished jobs per queue and state, kept by triggers on job, so the queue
-- gauges and `chassis-worker queues` never count the retained rows (contract section 9: an hour
-- of completions at 1,000 jobs/s is 3.6 million rows, which take seconds to count).
--
-- job_count holds, per (queue, state) of the finished states (completed, cancelled, failed),
-- any number of rows whose sum is the number of jobs in that state. The waiting and active
-- states are not kept here: they are counted through their partial indexes (job_fetch,
-- job_active), which hold only the waiting and active sets, and sends and claims never write
-- a counter.
--
-- Why triggers, not counting in our own statements: every statement that moves a job into or
-- out of a finished state (a completion, a failure, a cancel, a prune, an operator's retry,
-- resume or delete, a hand-written UPDATE, an older release still running during an upgrade)
-- is counted by construction, whoever runs it. The price, measured on the statement that
-- completes 200 jobs and claims 200 more: about 8% more server CPU (capturing the transition
-- rows is half of it), against 3% for the same counter update written into the statement; a
-- claim alone pays about 7%, a send only the WHEN test of the INSERT trigger.
--
-- No counter write ever waits: a statement adds its change to a counter row that no other
-- transaction holds (FOR UPDATE SKIP LOCKED), or to a row of its own when every one is held, so
-- concurrent statements never queue behind each other's commit and can never deadlock. Rows
-- pile up only under contention or from the paths below; maintenance folds them
-- (job_count_compact). The updated column n is not indexed, so every change is a HOT update
-- that page pruning reclaims without VACUUM; fillfactor 20 leaves room on the page for that.
--
-- Safe to run again (the recount at the end makes the counters exact whatever they held).

CREATE TABLE IF NOT EXISTS job_count (
    queue text NOT NULL,
    state job_state NOT NULL CHECK (state > 'active'),
    n     bigint NOT NULL
) WITH (fillfactor = 20);
CREATE INDEX IF NOT EXISTS job_count_key ON job_count (queue, state);

-- Adds n jobs to (queue, state). Under READ COMMITTED it updates a row no other transaction
-- holds: the lock is taken in one statement and the update made in the next, whose snapshot
-- sees the version just locked (in one statement, a version committed after the snapshot could
-- be locked yet not updated). Under REPEATABLE READ or SERIALIZABLE, locking a row another
-- transaction changed since the snapshot raises a serialization failure, so those transactions
-- always add a row of their own.
CREATE OR REPLACE FUNCTION job_count_add(q text, s job_state, d bigint) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    slot tid;
BEGIN
    IF d = 0 THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') = 'read committed' THEN
        -- index job_count_key; SKIP LOCKED: never waits for another writer's commit
        SELECT c.ctid INTO slot FROM job_count c WHERE c.queue = q AND c.state = s
        LIMIT 1 FOR UPDATE SKIP LOCKED;
    END IF;
    IF slot IS NULL THEN
        INSERT INTO job_count (queue, state, n) VALUES (q, s, d);
    ELSE
        UPDATE job_count SET n = n + d WHERE ctid = slot;
    END IF;
END
$$;

-- UPDATE and DELETE on job, once per statement: the net change per (queue, finished state)
-- between the rows before (old_jobs) and after (new_jobs). A claim or a hand-back changes no
-- finished state and writes nothing.
CREATE OR REPLACE FUNCTION job_count_changed() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    d record;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        FOR d IN
            SELECT x.queue, x.state, sum(x.n) AS n FROM (
                SELECT queue, state, 1 AS n FROM new_jobs WHERE state > 'active'
                UNION ALL
                SELECT queue, state, -1 FROM old_jobs WHERE state > 'active') x
            GROUP BY x.queue, x.state
        LOOP
            PERFORM job_count_add(d.queue, d.state, d.n);
        END LOOP;
    ELSE
        FOR d IN
            SELECT queue, state, count(*) AS n FROM old_jobs WHERE state > 'active'
            GROUP BY queue, state
        LOOP
            PERFORM job_count_add(d.queue, d.state, -d.n);
        END LOOP;
    END IF;
    RETURN NULL;
END
$$;

-- INSERT of a job that is already finished (a copy, a restore, a test fixture; sends insert
-- waiting jobs): once per such row, so a send pays only the WHEN test. It adds a row of its
-- own rather than updating one: one transaction updating one row many times would make every
-- later lookup walk all the versions it left.
CREATE OR REPLACE FUNCTION job_count_inserted() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO job_count (queue, state, n) VALUES (NEW.queue, NEW.state, 1);
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION job_count_truncated() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM job_count;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS job_count_update ON job;
DROP TRIGGER IF EXISTS job_count_delete ON job;
DROP TRIGGER IF EXISTS job_count_insert ON job;
DROP TRIGGER IF EXISTS job_count_truncate ON job;
CREATE TRIGGER job_count_update AFTER UPDATE ON job
    REFERENCING OLD TABLE AS old_jobs NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION job_count_changed();
CREATE TRIGGER job_count_delete AFTER DELETE ON job
    REFERENCING OLD TABLE AS old_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION job_count_changed();
CREATE TRIGGER job_count_insert AFTER INSERT ON job
    FOR EACH ROW WHEN (NEW.state > 'active') EXECUTE FUNCTION job_count_inserted();
CREATE TRIGGER job_count_truncate AFTER TRUNCATE ON job
    FOR EACH STATEMENT EXECUTE FUNCTION job_count_truncated();

-- Folds the rows of every (queue, state) that has more than `keep` of them into one, skipping
-- rows a writer holds right now (they are folded next time). Locks in one statement, deletes in
-- the next (see job_count_add), and checks that it deleted exactly what it locked. Returns the
-- number of rows removed. Run by maintenance; any number of callers may run it at once.
CREATE OR REPLACE FUNCTION job_count_compact(keep integer DEFAULT 4) RETURNS bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    k record;
    slots tid[];
    total numeric;
    locked integer;
    gone integer;
    removed bigint := 0;
BEGIN
    FOR k IN
        SELECT queue, state FROM job_count GROUP BY queue, state HAVING count(*) > keep
        ORDER BY queue, state
    LOOP
        SELECT array_agg(l.ctid), sum(l.n), count(*) INTO slots, total, locked FROM (
            SELECT c.ctid, c.n FROM job_count c WHERE c.queue = k.queue AND c.state = k.state
            FOR UPDATE SKIP LOCKED) l;
        CONTINUE WHEN locked < 2;
        DELETE FROM job_count WHERE ctid = ANY (slots);
        GET DIAGNOSTICS gone = ROW_COUNT;
        IF gone <> locked THEN
            RAISE EXCEPTION 'job_count_compact: locked % rows of (%, %) but deleted %',
                locked, k.queue, k.state, gone;
        END IF;
        IF total <> 0 THEN
            INSERT INTO job_count (queue, state, n) VALUES (k.queue, k.state, total);
            gone := gone - 1;
        END IF;
        removed := removed + gone;
    END LOOP;
    RETURN removed;
END
$$;

-- Recounts every finished job from the table itself: for a database that already holds jobs
-- (this migration, below) or counters someone edited by hand. SHARE mode waits for every
-- transaction writing job to end and holds off new writes until this one commits (reads go on),
-- so no change can fall between the count and the triggers. Takes as long as counting the
-- retained rows (seconds for millions); returns the number of finished jobs counted.
CREATE OR REPLACE FUNCTION job_count_reset() RETURNS bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    total bigint;
BEGIN
    LOCK TABLE job IN SHARE MODE;
    DELETE FROM job_count;
    INSERT INTO job_count (queue, state, n)
    SELECT queue, state, count(*) FROM job WHERE state > 'active' GROUP BY queue, state;
    SELECT COALESCE(sum(n), 0) INTO total FROM job_count;
    RETURN total;
END
$$;

SELECT job_count_reset();
