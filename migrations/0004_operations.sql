-- Job management (contract section 10): a queue can be paused. Every claim reads the flag, so
-- no replica starts a job of a paused queue after the pause commits; installs leave it alone,
-- so a paused queue stays paused across restarts and upgrades.
ALTER TABLE queue ADD COLUMN paused boolean NOT NULL DEFAULT false;
