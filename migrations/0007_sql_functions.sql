-- Enqueue from anywhere (contract section 11): send, send_many, emit_usage, schedule_timer and
-- cancel_timer as SQL functions, so any client (psql, Node, Go, Ruby, a trigger) enqueues inside
-- its own transaction. They are THE definition of a send: api_sender's statements call them too.
--
-- Same rules as api_sender: the queue's retry policy unless the call overrides it, its policy
-- copied onto the job and enforced by the unique indexes of 0001 (a refused singleton key is a
-- NULL id, never an error), one transactional NOTIFY (delivered on commit, dropped on rollback)
-- carrying the queue name when the job is due now and an empty payload when it is due later.
-- SECURITY INVOKER: a caller needs the api role's rights (config/roles.sql) and gets no more.
--
-- Errors: SQLSTATE P0002 for a queue that is not installed, 22023 for an invalid argument, the
-- message naming it and the error's COLUMN field holding its name alone (for drivers that map
-- it, as api_sender does). A call that raises writes nothing.
--
-- The schema and the NOTIFY channel are written into each body when this file runs (@s@ and
-- @channel@ below), so the functions need no search_path of their own: a SET clause would cost
-- every call a configuration save and restore.

DO $install$
DECLARE
    s       text := quote_ident(current_schema());
    channel text := quote_literal('chassis_jobs_' || current_schema());
    body    text;
BEGIN
body := $sql$
-- The checks every send makes, and its due time: at start_at, or start_after from now (the
-- database's clock), or now. The limits are api_sender.options' own.
CREATE OR REPLACE FUNCTION @s@._send_due(
    queue text, start_after interval, start_at timestamptz, singleton_key text,
    priority integer, retry_limit integer, retry_delay integer, expire_in_seconds integer)
RETURNS timestamptz LANGUAGE plpgsql STABLE SECURITY INVOKER AS $fn$
BEGIN
    IF queue IS NULL OR queue = '' THEN
        RAISE EXCEPTION 'queue must be a non-empty string'
            USING ERRCODE = '22023', COLUMN = 'queue';
    END IF;
    IF singleton_key = '' THEN
        RAISE EXCEPTION 'singleton_key must be a non-empty string or NULL'
            USING ERRCODE = '22023', COLUMN = 'singleton_key';
    END IF;
    IF priority IS NULL THEN
        RAISE EXCEPTION 'priority must be an integer'
            USING ERRCODE = '22023', COLUMN = 'priority';
    END IF;
    IF retry_limit < 0 THEN
        RAISE EXCEPTION 'retry_limit must be between 0 and 2147483647'
            USING ERRCODE = '22023', COLUMN = 'retry_limit';
    END IF;
    IF retry_delay < 0 THEN
        RAISE EXCEPTION 'retry_delay must be between 0 and 2147483647'
            USING ERRCODE = '22023', COLUMN = 'retry_delay';
    END IF;
    IF expire_in_seconds < 1 THEN
        RAISE EXCEPTION 'expire_in_seconds must be between 1 and 2147483647'
            USING ERRCODE = '22023', COLUMN = 'expire_in_seconds';
    END IF;
    IF start_at IS NOT NULL THEN
        IF start_after IS NOT NULL THEN
            RAISE EXCEPTION 'give at most one of start_after and start_at'
                USING ERRCODE = '22023', COLUMN = 'start_at';
        END IF;
        -- A finite instant in years 1-9999 (UTC) as in Python; -infinity and infinity pass, as
        -- asyncpg sends Python's datetime.min and datetime.max.
        IF isfinite(start_at)
           AND NOT (start_at >= '0001-01-01 00:00:00+00' AND start_at < '10000-01-01 00:00:00+00')
        THEN
            RAISE EXCEPTION 'start_at must fall between 0001-01-01 and 9999-12-31 (UTC)'
                USING ERRCODE = '22023', COLUMN = 'start_at';
        END IF;
        RETURN start_at;
    END IF;
    IF start_after IS NULL THEN
        RETURN now();
    END IF;
    -- 0 to 100 years of 365.25 days (api_sender.options.MAX_START_AFTER_SECONDS), reading
    -- the interval as extract(epoch) does: a year of 365.25 days, a month of 30.
    IF extract(epoch FROM start_after) NOT BETWEEN 0 AND 3155760000 THEN
        RAISE EXCEPTION 'start_after must be between 0 and 3155760000 seconds (100 years)'
            USING ERRCODE = '22023', COLUMN = 'start_after';
    END IF;
    RETURN now() + start_after;
END
$fn$;

CREATE OR REPLACE FUNCTION @s@._queue_not_found(queue text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $fn$
BEGIN
    RAISE EXCEPTION 'queue % does not exist in schema %', quote_literal(queue),
            quote_literal(@schema_literal@)
        USING ERRCODE = 'P0002', COLUMN = 'queue',
              HINT = 'a worker install (chassis-worker migrate) creates the queues';
END
$fn$;

-- One job: its id, or NULL when the queue's policy refuses a second job of singleton_key.
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
    due    timestamptz := @s@._send_due(queue, start_after, start_at, singleton_key, priority,
                                        retry_limit, retry_delay, expire_in_seconds);
    q      @s@.queue;
    new_id bigint;
BEGIN
    SELECT * INTO q FROM @s@.queue AS t WHERE t.name = send.queue;
    IF NOT FOUND THEN
        PERFORM @s@._queue_not_found(queue);
    END IF;
    -- Only short and stately queues have a unique index that can refuse a new job
    -- (job_policy_queued); every other send skips ON CONFLICT's speculative insertion.
    IF q.policy IN ('short', 'stately') THEN
        INSERT INTO @s@.job (queue, policy, data, priority, singleton_key, start_after,
                             retry_limit, retry_delay, retry_backoff, expire_seconds)
        VALUES (q.name, q.policy, COALESCE(send.data, 'null'), send.priority,
                send.singleton_key, due, COALESCE(send.retry_limit, q.retry_limit),
                COALESCE(send.retry_delay, q.retry_delay),
                COALESCE(send.retry_backoff, q.retry_backoff),
                COALESCE(send.expire_in_seconds, q.expire_seconds))
        ON CONFLICT DO NOTHING
        RETURNING id INTO new_id;
    ELSE
        INSERT INTO @s@.job (queue, policy, data, priority, singleton_key, start_after,
                             retry_limit, retry_delay, retry_backoff, expire_seconds)
        VALUES (q.name, q.policy, COALESCE(send.data, 'null'), send.priority,
                send.singleton_key, due, COALESCE(send.retry_limit, q.retry_limit),
                COALESCE(send.retry_delay, q.retry_delay),
                COALESCE(send.retry_backoff, q.retry_backoff),
                COALESCE(send.expire_in_seconds, q.expire_seconds))
        RETURNING id INTO new_id;
    END IF;
    IF new_id IS NOT NULL THEN
        PERFORM pg_notify(@channel@, CASE WHEN due <= now() THEN q.name ELSE '' END);
    END IF;
    RETURN new_id;
END
$fn$;

-- Many jobs of one queue, all or none, one NOTIFY; their ids in order. singleton_keys, when
-- given, has one entry per item (NULL: the shared singleton_key); on short and stately queues a
-- refused key is left out of the ids. (A LANGUAGE sql version, which spares plpgsql's copy of
-- the array argument, measured no faster on 20,000 items and re-plans at every call.)
CREATE OR REPLACE FUNCTION @s@.send_many(
    queue text,
    data jsonb[],
    start_after interval DEFAULT NULL,
    singleton_key text DEFAULT NULL,
    priority integer DEFAULT 0,
    retry_limit integer DEFAULT NULL,
    retry_delay integer DEFAULT NULL,
    retry_backoff boolean DEFAULT NULL,
    expire_in_seconds integer DEFAULT NULL,
    start_at timestamptz DEFAULT NULL,
    singleton_keys text[] DEFAULT NULL)
RETURNS bigint[] LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $fn$
DECLARE
    due timestamptz := @s@._send_due(queue, start_after, start_at, singleton_key, priority,
                                     retry_limit, retry_delay, expire_in_seconds);
    q   @s@.queue;
    ids bigint[];
    bad integer;
BEGIN
    IF data IS NULL OR array_ndims(data) > 1 THEN
        RAISE EXCEPTION 'data must be a one-dimensional array of jsonb'
            USING ERRCODE = '22023', COLUMN = 'data';
    END IF;
    IF singleton_keys IS NOT NULL THEN
        IF array_ndims(singleton_keys) > 1 THEN
            RAISE EXCEPTION 'singleton_keys must be a one-dimensional array'
                USING ERRCODE = '22023', COLUMN = 'singleton_keys';
        END IF;
        IF cardinality(singleton_keys) <> cardinality(data) THEN
            RAISE EXCEPTION 'singleton_keys has % entries for % items',
                    cardinality(singleton_keys), cardinality(data)
                USING ERRCODE = '22023', COLUMN = 'singleton_keys';
        END IF;
        bad := array_position(singleton_keys, '');
        IF bad IS NOT NULL THEN
            RAISE EXCEPTION 'singleton_keys.% must be a non-empty string or NULL', bad - 1
                USING ERRCODE = '22023', COLUMN = 'singleton_keys.' || (bad - 1);
        END IF;
    END IF;
    SELECT * INTO q FROM @s@.queue AS t WHERE t.name = send_many.queue;
    IF NOT FOUND THEN
        PERFORM @s@._queue_not_found(queue);
    END IF;
    IF cardinality(data) = 0 THEN
        RETURN '{}';
    END IF;
    -- As in send: only short and stately queues pay for ON CONFLICT, per row. A unique index
    -- that could refuse a job of another policy must extend the first branch.
    IF q.policy IN ('short', 'stately') THEN
        WITH ins AS (
            INSERT INTO @s@.job (queue, policy, data, priority, singleton_key, start_after,
                                 retry_limit, retry_delay, retry_backoff, expire_seconds)
            SELECT q.name, q.policy, COALESCE(d.data, 'null'), send_many.priority,
                   COALESCE(d.key, send_many.singleton_key), due,
                   COALESCE(send_many.retry_limit, q.retry_limit),
                   COALESCE(send_many.retry_delay, q.retry_delay),
                   COALESCE(send_many.retry_backoff, q.retry_backoff),
                   COALESCE(send_many.expire_in_seconds, q.expire_seconds)
            FROM unnest(send_many.data, send_many.singleton_keys) WITH ORDINALITY AS d(data, key, n)
            ORDER BY d.n
            ON CONFLICT DO NOTHING
            RETURNING id
        )
        SELECT COALESCE(array_agg(ins.id ORDER BY ins.id), '{}') INTO ids FROM ins;
    ELSE
        WITH ins AS (
            INSERT INTO @s@.job (queue, policy, data, priority, singleton_key, start_after,
                                 retry_limit, retry_delay, retry_backoff, expire_seconds)
            SELECT q.name, q.policy, COALESCE(d.data, 'null'), send_many.priority,
                   COALESCE(d.key, send_many.singleton_key), due,
                   COALESCE(send_many.retry_limit, q.retry_limit),
                   COALESCE(send_many.retry_delay, q.retry_delay),
                   COALESCE(send_many.retry_backoff, q.retry_backoff),
                   COALESCE(send_many.expire_in_seconds, q.expire_seconds)
            FROM unnest(send_many.data, send_many.singleton_keys) WITH ORDINALITY AS d(data, key, n)
            ORDER BY d.n
            RETURNING id
        )
        SELECT COALESCE(array_agg(ins.id ORDER BY ins.id), '{}') INTO ids FROM ins;
    END IF;
    IF cardinality(ids) > 0 THEN
        PERFORM pg_notify(@channel@, CASE WHEN due <= now() THEN q.name ELSE '' END);
    END IF;
    RETURN ids;
END
$fn$;

-- The timer of (queue, key) that has not finished, if any, becomes cancelled, whether it waits
-- (created, retry) or runs (active). A running one keeps running to its end, but every outcome
-- its worker writes and every rescue is fenced on state = 'active', so it never runs again. A
-- concurrent outcome write holds the row lock; this UPDATE waits for it and re-checks the row's
-- new state. The states are spelled out one by one so each finds a partial index: created
-- through job_timer_key, retry through job_fetch, active through job_active. True when one was
-- pending, false when none was; an unknown queue raises P0002 as every function here does
-- (api_sender's Timers.cancel looks the queue up first and answers false, as it always has).
CREATE OR REPLACE FUNCTION @s@.cancel_timer(queue text, key text)
RETURNS boolean LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $fn$
BEGIN
    IF queue IS NULL OR queue = '' THEN
        RAISE EXCEPTION 'queue must be a non-empty string'
            USING ERRCODE = '22023', COLUMN = 'queue';
    END IF;
    IF key IS NULL OR key = '' THEN
        RAISE EXCEPTION 'key must be a non-empty string'
            USING ERRCODE = '22023', COLUMN = 'key';
    END IF;
    UPDATE @s@.job AS j SET state = 'cancelled', completed_at = now()
    WHERE j.queue = cancel_timer.queue AND j.singleton_key = cancel_timer.key AND j.is_timer
      AND (j.state = 'created' OR j.state = 'retry' OR j.state = 'active');
    IF FOUND THEN
        RETURN true;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM @s@.queue AS q WHERE q.name = cancel_timer.queue) THEN
        PERFORM @s@._queue_not_found(queue);
    END IF;
    RETURN false;
END
$fn$;

-- A one-off timer due at `at`; with a key, the pending timer of that key on that queue is
-- cancelled in the same transaction, under a lock on (queue, key) held to its end, so however
-- many replace one key at once exactly one stays pending. Its job id.
CREATE OR REPLACE FUNCTION @s@.schedule_timer(
    queue text, at timestamptz, data jsonb DEFAULT NULL, key text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $fn$
DECLARE
    q      @s@.queue;
    new_id bigint;
BEGIN
    IF queue IS NULL OR queue = '' THEN
        RAISE EXCEPTION 'queue must be a non-empty string'
            USING ERRCODE = '22023', COLUMN = 'queue';
    END IF;
    IF at IS NULL OR (isfinite(at)
                      AND NOT (at >= '0001-01-01 00:00:00+00' AND at < '10000-01-01 00:00:00+00'))
    THEN
        RAISE EXCEPTION 'at must be an instant between 0001-01-01 and 9999-12-31 (UTC)'
            USING ERRCODE = '22023', COLUMN = 'at';
    END IF;
    IF key = '' THEN
        RAISE EXCEPTION 'key must be a non-empty string or NULL'
            USING ERRCODE = '22023', COLUMN = 'key';
    END IF;
    SELECT * INTO q FROM @s@.queue AS t WHERE t.name = schedule_timer.queue;
    IF NOT FOUND THEN
        PERFORM @s@._queue_not_found(queue);
    END IF;
    IF key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(
            hashtextextended(@s_literal@ || ':timer:' || queue || ':' || key, 0));
        PERFORM @s@.cancel_timer(queue, key);
    END IF;
    INSERT INTO @s@.job (queue, policy, data, priority, singleton_key, start_after,
                         retry_limit, retry_delay, retry_backoff, expire_seconds, is_timer)
    VALUES (q.name, 'standard', COALESCE(schedule_timer.data, 'null'), 0, schedule_timer.key,
            schedule_timer.at, q.retry_limit, q.retry_delay, q.retry_backoff, q.expire_seconds,
            schedule_timer.key IS NOT NULL)
    RETURNING id INTO new_id;
    PERFORM pg_notify(@channel@, CASE WHEN schedule_timer.at <= now() THEN q.name ELSE '' END);
    RETURN new_id;
END
$fn$;

-- Usage events, validated exactly as the HTTP ingest validates them (worker/http/body.py and
-- api_sender.events.UsageEvent), except that an absent or null id or occurred_at means a new
-- ULID and now(), as in Python. The helpers below name what they check after Python's rules.

-- A JSON number literal as Python's json module reads it: an integer literal is an int (at
-- most 4300 digits), any other literal a float, which is infinite from 2^1024 - 2^970 in
-- magnitude up. as_float: the value becomes a float whatever its literal (a quantity). NULL
-- when the number is storable, else the problem.
CREATE OR REPLACE FUNCTION @s@._json_number_problem(literal text, as_float boolean)
RETURNS text LANGUAGE plpgsql IMMUTABLE SECURITY INVOKER AS $fn$
DECLARE
    m      text[] := regexp_match(literal, '^-?(0|[1-9][0-9]*)(?:\.([0-9]+))?(?:[eE]([-+]?[0-9]+))?$');
    digits text := m[1] || COALESCE(m[2], '');
    sig    text := ltrim(digits, '0');
    mag    numeric;
BEGIN
    IF m[2] IS NULL AND m[3] IS NULL AND length(m[1]) > 4300 THEN
        RETURN 'has more than 4300 digits (Python''s limit for an integer)';
    END IF;
    IF (m[2] IS NULL AND m[3] IS NULL AND NOT as_float) OR sig = '' THEN
        RETURN NULL;
    END IF;
    -- The value lies in [10^(mag-1), 10^mag).
    mag := length(m[1]) - (length(digits) - length(sig)) + COALESCE(m[3]::numeric, 0);
    IF mag > 309 OR (mag = 309 AND rpad(left(sig, 309), 309, '0')::numeric >= 179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497792) THEN
        RETURN 'must be a finite number (JSON has no NaN or Infinity)';
    END IF;
    RETURN NULL;
END
$fn$;

-- A finite JSON number literal as the float Python's json module (or float()) makes of it:
-- correctly rounded, and 0 (keeping its sign) below half the smallest subnormal, where
-- float8's own input would raise instead.
CREATE OR REPLACE FUNCTION @s@._json_float8(literal text)
RETURNS float8 LANGUAGE plpgsql IMMUTABLE SECURITY INVOKER AS $fn$
DECLARE
    m      text[] := regexp_match(literal, '^(-?)(0|[1-9][0-9]*)(?:\.([0-9]+))?(?:[eE]([-+]?[0-9]+))?$');
    digits text := m[2] || COALESCE(m[3], '');
    sig    text := ltrim(digits, '0');
    mag    numeric;
    x      numeric;
BEGIN
    IF sig = '' THEN
        RETURN (m[1] || '0')::float8;
    END IF;
    mag := length(m[2]) - (length(digits) - length(sig)) + COALESCE(m[4]::numeric, 0);
    IF mag <= -324 THEN
        RETURN (m[1] || '0')::float8;
    END IF;
    IF mag = -323 THEN
        x := ('0.' || left(rtrim(sig, '0'), 1000) || 'e-323')::numeric * power(2::numeric, 1075);
        IF x < 1 OR (x = 1 AND length(rtrim(sig, '0')) <= 1000) THEN
            RETURN (m[1] || '0')::float8;
        END IF;
    END IF;
    RETURN literal::float8;
END
$fn$;

-- A float8 as Python's repr writes it (json.dumps of a float): shortest round-trip digits,
-- exponent form below 1e-4 and from 1e16 (float8's own output switches at 1e15), and ".0" on
-- an integral value. Needs extra_float_digits = 1, which emit_usage sets.
CREATE OR REPLACE FUNCTION @s@._python_float_repr(value float8)
RETURNS text LANGUAGE plpgsql IMMUTABLE SECURITY INVOKER AS $fn$
DECLARE
    t text := value::text;
BEGIN
    IF t ~ 'e\+15$' THEN
        t := t::numeric::text;
    END IF;
    IF t !~ '[.e]' THEN
        t := t || '.0';
    END IF;
    RETURN t;
END
$fn$;

-- meter and workspace_id: a JSON string, trimmed of Unicode White_Space (pydantic's
-- str_strip_whitespace), 1 to 200 characters, no NUL and no lone surrogate (nul, sur: the
-- markers emit_usage put in their place). The trimmed text.
CREATE OR REPLACE FUNCTION @s@._usage_label(value json, field text, nul text, sur text)
RETURNS text LANGUAGE plpgsql IMMUTABLE SECURITY INVOKER AS $fn$
DECLARE
    t text;
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION '% is required', field USING ERRCODE = '22023', COLUMN = field;
    END IF;
    IF json_typeof(value) <> 'string' THEN
        RAISE EXCEPTION '% must be a string', field USING ERRCODE = '22023', COLUMN = field;
    END IF;
    t := btrim(value #>> '{}', E'\u0009\u000a\u000b\u000c\u000d\u0020\u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000');
    IF strpos(t, nul) > 0 THEN
        RAISE EXCEPTION '% contains a NUL character (\u0000), which PostgreSQL cannot store', field
            USING ERRCODE = '22023', COLUMN = field;
    END IF;
    IF strpos(t, sur) > 0 THEN
        RAISE EXCEPTION '% contains a lone UTF-16 surrogate, which is not valid Unicode', field
            USING ERRCODE = '22023', COLUMN = field;
    END IF;
    IF char_length(t) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION '% must be 1 to 200 characters (after trimming whitespace)', field
            USING ERRCODE = '22023', COLUMN = field;
    END IF;
    RETURN t;
END
$fn$;

-- A new ULID: 48 bits of Unix milliseconds, 80 random bits, Crockford base32.
CREATE OR REPLACE FUNCTION @s@._new_ulid()
RETURNS text LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $fn$
DECLARE
    alphabet CONSTANT text := '0123456789ABCDEFGHJKMNPQRSTVWXYZ';
    r     bytea := uuid_send(gen_random_uuid());
    bits  text := '00' || right(((extract(epoch FROM clock_timestamp()) * 1000)::bigint)::bit(64)::text, 48);
    out   text := '';
    i     integer;
BEGIN
    -- Bytes 0-5 and 10-13 of a version 4 UUID are random (6 and 8 carry its version and variant).
    FOREACH i IN ARRAY ARRAY[0, 1, 2, 3, 4, 5, 10, 11, 12, 13] LOOP
        bits := bits || get_byte(r, i)::bit(8)::text;
    END LOOP;
    FOR i IN 0..25 LOOP
        out := out || substr(alphabet, substr(bits, i * 5 + 1, 5)::bit(5)::integer + 1, 1);
    END LOOP;
    RETURN out;
END
$fn$;

-- occurred_at: an RFC 3339 timestamp with an offset, as api_sender.events.parse_timestamp reads
-- it (Python's strip, its regex, datetime.fromisoformat's field ranges, fractions past
-- microseconds cut off, an offset under 24 hours, the instant in years 1-9999 in UTC), written
-- back as datetime.isoformat() writes it. NULL for absent or null: now(), in UTC.
CREATE OR REPLACE FUNCTION @s@._usage_instant(value json)
RETURNS text LANGUAGE plpgsql STABLE SECURITY INVOKER AS $fn$
DECLARE
    m       text[];
    y int; mo int; d int; h int; mi int; sec int; micro int;
    offset_minutes int := 0;
    local   timestamp;
    utc     timestamp;
    fixed   timestamp;
    out     text;
BEGIN
    IF value IS NULL OR json_typeof(value) = 'null' THEN
        utc := now() AT TIME ZONE 'UTC';
        micro := (extract(microseconds FROM utc)::int) % 1000000;
        RETURN to_char(utc, 'YYYY-MM-DD"T"HH24:MI:SS')
            || CASE WHEN micro <> 0 THEN '.' || lpad(micro::text, 6, '0') ELSE '' END
            || '+00:00';
    END IF;
    IF json_typeof(value) = 'string' THEN
        m := regexp_match(btrim(value #>> '{}', E'\u0009\u000a\u000b\u000c\u000d\u001c\u001d\u001e\u001f\u0020\u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000'),
            '^([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))$');
    END IF;
    IF m IS NULL THEN
        RAISE EXCEPTION 'occurred_at must be an RFC 3339 timestamp with an offset, e.g. 2024-05-01T12:00:00Z'
            USING ERRCODE = '22023', COLUMN = 'occurred_at';
    END IF;
    y := m[1]::int; mo := m[2]::int; d := m[3]::int;
    h := m[4]::int; mi := m[5]::int; sec := m[6]::int;
    micro := COALESCE(rpad(left(m[7], 6), 6, '0')::int, 0);
    IF m[8] IS NOT NULL THEN
        offset_minutes := (m[9]::int * 60 + m[10]::int) * CASE WHEN m[8] = '-' THEN -1 ELSE 1 END;
    END IF;
    IF y < 1 OR mo NOT BETWEEN 1 AND 12 OR h > 23 OR mi > 59 OR sec > 59
       OR abs(offset_minutes) >= 1440
       OR d NOT BETWEEN 1 AND extract(day FROM make_date(y, mo, 1) + interval '1 month - 1 day')
    THEN
        RAISE EXCEPTION 'occurred_at must be an RFC 3339 timestamp'
            USING ERRCODE = '22023', COLUMN = 'occurred_at';
    END IF;
    local := make_timestamp(y, mo, d, h, mi, sec + micro / 1000000.0);
    utc := local - make_interval(mins => offset_minutes);
    IF utc < '0001-01-01 00:00:00' OR utc >= '10000-01-01 00:00:00' THEN
        RAISE EXCEPTION 'occurred_at must fall between 0001-01-01 and 9999-12-31 (UTC)'
            USING ERRCODE = '22023', COLUMN = 'occurred_at';
    END IF;
    out := lpad(y::text, 4, '0') || '-' || lpad(mo::text, 2, '0') || '-' || lpad(d::text, 2, '0')
        || 'T' || lpad(h::text, 2, '0') || ':' || lpad(mi::text, 2, '0') || ':'
        || lpad(sec::text, 2, '0')
        || CASE WHEN micro <> 0 THEN '.' || lpad(micro::text, 6, '0') ELSE '' END;
    RETURN out || CASE WHEN offset_minutes < 0 THEN '-' ELSE '+' END
        || lpad((abs(offset_minutes) / 60)::text, 2, '0') || ':'
        || lpad((abs(offset_minutes) % 60)::text, 2, '0');
END
$fn$;

-- One usage event onto usage-events, as sender.usage.emit sends it (its id as the singleton
-- key, backoff on, the queue's retry budget); the event id. Takes json, not jsonb: jsonb would
-- keep the last of duplicate keys and refuse NUL before this runs.
CREATE OR REPLACE FUNCTION @s@.emit_usage(event json)
RETURNS text LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET extra_float_digits = 1 AS $fn$
DECLARE
    raw     text := event::text;
    -- A \u0000 escape becomes this marker, so the checks below can name the field it is in
    -- (PostgreSQL refuses to turn \u0000 into text at all).
    nul     text := 'NUL' || md5(event::text) || 'NUL';
    -- And a lone UTF-16 surrogate escape (\ud800-\udfff not in a pair) this one.
    sur     text := 'SUR' || md5(event::text) || 'SUR';
    ev      json;
    v       json;
    k       text;
    problem text;
    event_id text;
    meter   text;
    workspace_id text;
    quantity float8;
    occurred_at text;
    dims    jsonb;
    payload jsonb;
BEGIN
    IF event IS NULL THEN
        RAISE EXCEPTION 'event must be a JSON object' USING ERRCODE = '22023', COLUMN = '(event)';
    END IF;
    IF octet_length(raw) > 1048576 THEN
        RAISE EXCEPTION 'event is larger than 1 MiB (1048576 bytes), the ingest''s limit'
            USING ERRCODE = '22023', COLUMN = '(event)';
    END IF;
    IF strpos(raw, E'\\u0000') > 0 THEN
        raw := regexp_replace(raw, E'(?<!\\\\)((?:\\\\\\\\)*)\\\\u0000', E'\\1' || nul, 'g');
    END IF;
    IF raw ~* E'\\\\ud[89a-f]' THEN
        -- A high surrogate not followed by a low one, then a low one not preceded by a high.
        raw := regexp_replace(raw,
            E'(?<!\\\\)((?:\\\\\\\\)*)\\\\u[dD][89abAB][0-9a-fA-F]{2}(?![\\\\]u[dD][c-fC-F][0-9a-fA-F]{2})',
            E'\\1' || sur, 'g');
        raw := regexp_replace(raw,
            E'(?<![\\\\]u[dD][89abAB][0-9a-fA-F]{2})(?<!\\\\)((?:\\\\\\\\)*)\\\\u[dD][c-fC-F][0-9a-fA-F]{2}',
            E'\\1' || sur, 'g');
        -- Whatever the two missed (a pair split by an escaped backslash) is refused whole.
        BEGIN
            PERFORM json_strip_nulls(raw::json);
        EXCEPTION WHEN invalid_text_representation THEN
            RAISE EXCEPTION 'the event contains a lone UTF-16 surrogate, which is not valid Unicode'
                USING ERRCODE = '22023', COLUMN = '(event)';
        END;
    END IF;
    ev := raw::json;
    IF json_typeof(ev) <> 'object' THEN
        RAISE EXCEPTION 'the event must be a JSON object' USING ERRCODE = '22023', COLUMN = '(event)';
    END IF;
    SELECT t.key INTO k FROM json_each(ev) AS t GROUP BY t.key HAVING count(*) > 1 LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'invalid JSON: the key % appears twice in the event', replace(replace(k, nul, '\u0000'), sur, '\ud800')
            USING ERRCODE = '22023', COLUMN = replace(replace(k, nul, '\u0000'), sur, '\ud800');
    END IF;
    SELECT t.key INTO k FROM json_each(ev) AS t
    WHERE t.key NOT IN ('id', 'meter', 'quantity', 'occurred_at', 'workspace_id', 'dimensions')
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION '% is not a field of a usage event', replace(replace(k, nul, '\u0000'), sur, '\ud800')
            USING ERRCODE = '22023', COLUMN = replace(replace(k, nul, '\u0000'), sur, '\ud800');
    END IF;

    meter := @s@._usage_label(ev -> 'meter', 'meter', nul, sur);
    workspace_id := @s@._usage_label(ev -> 'workspace_id', 'workspace_id', nul, sur);

    v := ev -> 'quantity';
    IF v IS NULL THEN
        RAISE EXCEPTION 'quantity is required' USING ERRCODE = '22023', COLUMN = 'quantity';
    END IF;
    IF json_typeof(v) <> 'number' THEN
        RAISE EXCEPTION 'quantity must be a number' USING ERRCODE = '22023', COLUMN = 'quantity';
    END IF;
    IF @s@._json_number_problem(v::text, true) IS NOT NULL THEN
        RAISE EXCEPTION 'quantity must be finite' USING ERRCODE = '22023', COLUMN = 'quantity';
    END IF;
    quantity := @s@._json_float8(v::text);
    IF quantity < 0 THEN
        RAISE EXCEPTION 'quantity must not be negative' USING ERRCODE = '22023', COLUMN = 'quantity';
    END IF;

    v := ev -> 'id';
    IF v IS NULL OR json_typeof(v) = 'null' THEN
        event_id := @s@._new_ulid();
    ELSIF json_typeof(v) <> 'string' THEN
        RAISE EXCEPTION 'id must be a ULID string' USING ERRCODE = '22023', COLUMN = 'id';
    ELSE
        -- Python's strip() and upper(): the few letters whose capitals are ASCII are spelled out.
        event_id := translate(
            replace(replace(replace(replace(replace(btrim(v #>> '{}', E'\u0009\u000a\u000b\u000c\u000d\u001c\u001d\u001e\u001f\u0020\u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000'),
                E'\u00df', 'SS'), E'\u017f', 'S'), E'\ufb00', 'FF'), E'\ufb05', 'ST'),
                E'\ufb06', 'ST'),
            'abcdefghijklmnopqrstuvwxyz', 'ABCDEFGHIJKLMNOPQRSTUVWXYZ');
        IF event_id !~ '^[0-7][0-9A-HJKMNP-TV-Z]{25}$' THEN
            RAISE EXCEPTION 'id must be a 26-character ULID (Crockford base32)'
                USING ERRCODE = '22023', COLUMN = 'id';
        END IF;
    END IF;

    occurred_at := @s@._usage_instant(ev -> 'occurred_at');

    v := ev -> 'dimensions';
    IF v IS NOT NULL AND json_typeof(v) <> 'null' THEN
        IF json_typeof(v) <> 'object' THEN
            RAISE EXCEPTION 'dimensions must be an object'
                USING ERRCODE = '22023', COLUMN = 'dimensions';
        END IF;
        -- Every value and key, at most 32 levels of objects and arrays (DIMENSIONS_DEPTH).
        WITH RECURSIVE walk(path, depth, value, in_object) AS (
            SELECT ARRAY['dimensions'], 0, v, false
            UNION ALL
            SELECT w.path || c.key, w.depth + 1, c.value, c.in_object
            FROM walk AS w
            CROSS JOIN LATERAL (
                SELECT e.key, e.value, true AS in_object
                FROM json_each(CASE WHEN json_typeof(w.value) = 'object' THEN w.value END) AS e
                UNION ALL
                SELECT (a.n - 1)::text, a.value, false
                FROM json_array_elements(CASE WHEN json_typeof(w.value) = 'array' THEN w.value END)
                     WITH ORDINALITY AS a(value, n)
            ) AS c
            WHERE w.depth < 32
        ), found AS (
            SELECT w.path, CASE
                WHEN w.depth >= 32 AND json_typeof(w.value) IN ('object', 'array')
                    THEN 'is nested more than 32 levels deep'
                WHEN w.in_object AND strpos(w.path[cardinality(w.path)], nul) > 0
                    THEN 'key contains a NUL character (\u0000), which PostgreSQL cannot store'
                WHEN json_typeof(w.value) = 'string' AND strpos(w.value::text, nul) > 0
                    THEN 'contains a NUL character (\u0000), which PostgreSQL cannot store'
                WHEN w.in_object AND strpos(w.path[cardinality(w.path)], sur) > 0
                    THEN 'key contains a lone UTF-16 surrogate, which is not valid Unicode'
                WHEN json_typeof(w.value) = 'string' AND strpos(w.value::text, sur) > 0
                    THEN 'contains a lone UTF-16 surrogate, which is not valid Unicode'
                WHEN json_typeof(w.value) = 'number'
                    THEN @s@._json_number_problem(w.value::text, false)
            END AS problem
            FROM walk AS w
            UNION ALL
            SELECT w.path, 'appears twice in one object (invalid JSON)'
            FROM walk AS w WHERE w.in_object GROUP BY w.path HAVING count(*) > 1
        )
        SELECT replace(replace(array_to_string(f.path, '.'), nul, '\u0000'), sur, '\ud800')
               || ' ' || f.problem
        INTO problem FROM found AS f WHERE f.problem IS NOT NULL LIMIT 1;
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION '%', problem
                USING ERRCODE = '22023', COLUMN = split_part(problem, ' ', 1);
        END IF;
        -- pydantic trims the top-level keys (dict[str, Any]); of two that then match, the later
        -- value stays.
        SELECT COALESCE(jsonb_object_agg(btrim(e.key, E'\u0009\u000a\u000b\u000c\u000d\u0020\u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000'), e.value::jsonb ORDER BY e.n), '{}')
        INTO dims FROM json_each(v) WITH ORDINALITY AS e(key, value, n);
    END IF;

    payload := jsonb_build_object(
        'id', event_id, 'meter', meter, 'quantity', @s@._python_float_repr(quantity)::jsonb,
        'occurred_at', occurred_at, 'workspace_id', workspace_id);
    IF dims IS NOT NULL THEN
        payload := payload || jsonb_build_object('dimensions', dims);
    END IF;
    PERFORM @s@.send('usage-events', payload, singleton_key => event_id, retry_backoff => true);
    RETURN event_id;
END
$fn$;
$sql$;
    -- The lock key is api_sender's own ('"<schema>":timer:<queue>:<key>').
    body := replace(body, '@s_literal@', quote_literal('"' || current_schema() || '"'));
    body := replace(body, '@schema_literal@', quote_literal(current_schema()));
    body := replace(body, '@channel@', channel);
    body := replace(body, '@s@', s);
    EXECUTE body;
END
$install$;
