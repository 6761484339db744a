-- The console's chart of jobs completed and failed per minute (contract section 10), tallied a
-- minute or two at a time from the job_finished index by one replica (and by the console when
-- no worker has lately), so drawing the last hour never counts an hour of retained rows. Rows
-- older than a day are dropped by the worker's tally.
CREATE TABLE IF NOT EXISTS job_minute (
    minute    timestamptz PRIMARY KEY,
    completed bigint NOT NULL DEFAULT 0,
    failed    bigint NOT NULL DEFAULT 0
);
