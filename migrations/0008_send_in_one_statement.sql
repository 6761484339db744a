-- send (0007) in fewer steps on its common path, with the same arguments, rules and errors:
-- * a send with no options checks nothing more than the queue name and is due now(), without
--   the call of _send_due (which every other send still makes, with all its checks);
-- * a queue of policy standard or singleton (no unique index can refuse its job) is read by the
--   INSERT itself (INSERT ... SELECT FROM queue): one statement instead of a lookup and then an
--   insert. A short or stately queue (ON CONFLICT DO NOTHING: a refused key is a NULL id) and
--   an unknown queue (P0002) take a second statement, as before;
-- * the NOTIFY is an assignment, which plpgsql evaluates without a query of its own (PERFORM
--   runs one).
-- Measured on this project's machine, SELECT jobs.send('q', data) on a standard queue: about
-- 3-4 us less server time per call (docs/drain-profile.md has the send decomposition).

DO $install$
DECLARE
    s       text := quote_ident(current_schema());
    channel text := quote_literal('chassis_jobs_' || current_schema());
    body    text;
BEGIN
body := $sql$
CREATE OR REPLACE FUNCTION @s@.send(
    queue text,
    data jsonb DEFAULT NULL,
    start_after interval DEFAULT NULL,
    singleton_key text DEFAULT NULL,
    priority integer DEFAULT 0,
    retry_limit integer DEFAULT NULL,
    retry_delay integer DEFAULT NULL,
    retry_backoff boolean DEFAULT NULL,
    expire_in_seconds integer DEFAULT NULL,
    start_at timestamptz DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $fn$
DECLARE
    due      timestamptz;
    new_id   bigint;
    notified boolean;
BEGIN
    -- No option given: nothing to check but the queue name (a NULL name fails this test too
    -- and is refused by _send_due).
    IF send.queue <> '' AND send.start_after IS NULL AND send.start_at IS NULL
       AND send.singleton_key IS NULL AND send.priority IS NOT NULL
       AND send.retry_limit IS NULL AND send.retry_delay IS NULL
       AND send.expire_in_seconds IS NULL THEN
        due := now();
    ELSE
        due := @s@._send_due(queue, start_after, start_at, singleton_key, priority,
                             retry_limit, retry_delay, expire_in_seconds);
    END IF;
    -- Only short and stately queues have a unique index that can refuse a new job
    -- (job_policy_queued): every other queue's job is inserted without ON CONFLICT's
    -- speculative insertion, in the statement that reads the queue.
    INSERT INTO @s@.job (queue, policy, data, priority, singleton_key, start_after,
                         retry_limit, retry_delay, retry_backoff, expire_seconds)
    SELECT t.name, t.policy, COALESCE(send.data, 'null'), send.priority, send.singleton_key,
           due, COALESCE(send.retry_limit, t.retry_limit),
           COALESCE(send.retry_delay, t.retry_delay),
           COALESCE(send.retry_backoff, t.retry_backoff),
           COALESCE(send.expire_in_seconds, t.expire_seconds)
    FROM @s@.queue AS t
    WHERE t.name = send.queue AND t.policy NOT IN ('short', 'stately')
    RETURNING id INTO new_id;
    IF NOT FOUND THEN
        -- A short or stately queue (or one whose policy changed since the statement above).
        INSERT INTO @s@.job (queue, policy, data, priority, singleton_key, start_after,
                             retry_limit, retry_delay, retry_backoff, expire_seconds)
        SELECT t.name, t.policy, COALESCE(send.data, 'null'), send.priority,
               send.singleton_key, due, COALESCE(send.retry_limit, t.retry_limit),
               COALESCE(send.retry_delay, t.retry_delay),
               COALESCE(send.retry_backoff, t.retry_backoff),
               COALESCE(send.expire_in_seconds, t.expire_seconds)
        FROM @s@.queue AS t
        WHERE t.name = send.queue
        ON CONFLICT DO NOTHING
        RETURNING id INTO new_id;
        IF NOT FOUND AND NOT EXISTS (SELECT FROM @s@.queue AS t WHERE t.name = send.queue) THEN
            PERFORM @s@._queue_not_found(queue);
        END IF;
    END IF;
    IF new_id IS NOT NULL THEN
        notified := pg_notify(@channel@, CASE WHEN due <= now() THEN send.queue ELSE '' END)
                    IS NULL;
    END IF;
    RETURN new_id;
END
$fn$;
$sql$;
    body := replace(body, '@channel@', channel);
    body := replace(body, '@s@', s);
    EXECUTE body;
END
$install$;
