-- The console's chart of jobs completed and failed per minute (contract section 10), tallied a
-- minute or two at a time from the job_finished index by one replica (and by the console when
-- no worker has lately), so drawing the last hour never counts an hour of retained rows. Rows
-- older than a day are dropped by the worker's tally.
CREATE TABLE IF NOT EXISTS job_minute (
    minute    timestamptz PRIMARY KEY,
    completed bigint NOT NULL DEFAULT 0,
    failed    bigint NOT NULL DEFAULT 0
);

-- Operator lists of the states people look for (contract section 10: "filter the failed jobs
-- of a queue"), newest first: failed, cancelled and retry jobs are few, and scattered among
-- millions of completed ones, so without this a filtered list walks the primary key backwards
-- through them. Partial: only a failure or a cancel writes an entry, never a send, a claim or a
-- completion (the drain's path). Other states are listed through job_pkey (completed and new
-- created jobs are the newest rows) or job_active.
CREATE INDEX IF NOT EXISTS job_settled ON job (queue, state, id)
    WHERE state IN ('retry', 'cancelled', 'failed');
