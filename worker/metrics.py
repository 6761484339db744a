"""The Prometheus metrics of the daemon (contract section 9 and the operational extras)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

USAGE_HELD = Counter(
    "usage_events_held_total",
    "Usage events held for a re-drive, by reason: retry_budget (the retry budget ran out) or "
    "occurred_at_window (the hub refused the event's date for now)",
    ["reason"],
)
USAGE_DELIVERED = Counter(
    "usage_events_delivered_total",
    "Usage events the downstream answered accepted or duplicate",
)
JOBS_COMPLETED = Counter("jobs_completed_total", "Jobs completed", ["queue"])
JOBS_FAILED = Counter("jobs_failed_total", "Failed job attempts (including rescues)", ["queue"])
JOBS_LEASE_LOST = Counter(
    "jobs_lease_lost_total",
    "Completions or failures that matched no row because the job was rescued or expired "
    "meanwhile (a late write from a worker that lost its claim)",
    ["queue"],
)
JOBS_RESCUED = Counter(
    "jobs_rescued_total", "Active jobs failed by maintenance", ["queue", "reason"]
)
JOBS_HANDED_BACK = Counter(
    "jobs_handed_back_total", "Claimed jobs returned to the queue on shutdown", ["queue"]
)
QUEUE_JOBS = Gauge("queue_jobs", "Jobs per queue and state", ["queue", "state"])
QUEUE_OLDEST_WAITING = Gauge(
    "queue_oldest_waiting_seconds",
    "Age of the oldest job waiting to run (due, not yet claimed), 0 when none",
    ["queue"],
)
QUEUE_PAUSED = Gauge("queue_paused", "1 while the queue is paused (no new job starts)", ["queue"])
JOB_DURATION = Histogram(
    "job_duration_seconds",
    "Handler run time",
    ["queue"],
    buckets=(0.001, 0.005, 0.02, 0.1, 0.5, 2, 10, 60, 300),
)
PURGE_DELETED = Counter(
    "purge_deleted_rows_total", "Rows a retention purge deleted or retired", ["queue"]
)
DB_RECONNECTS = Counter(
    "db_reconnects_total", "Reconnections of a dedicated connection", ["connection"]
)
READY = Gauge("worker_ready", "1 when /readyz answers 200")
