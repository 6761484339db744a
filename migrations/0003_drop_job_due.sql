-- Builds before 2026-11-30 created index job_due (queue, start_after) on the waiting set. The
-- probe now reads job_fetch by a loose index scan, so job_due only costs every send one more
-- index entry. Databases installed since never had it; IF EXISTS makes this a no-op there.
DROP INDEX IF EXISTS job_due;
