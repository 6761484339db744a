"""The Prometheus metrics of the daemon (contract section 9 and the operational extras)."""

from __future__ import annotations

from bisect import bisect_left

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


class DurationTally:
    """Observations of one labelled histogram (``JOB_DURATION.labels(queue)``) counted here,
    without a lock, and added to it by :meth:`flush` in one go: one increment per bucket used
    and one of the sum, instead of two locked increments per observation.

    The caller flushes before the observations' jobs show as finished (the poller, whenever
    outcomes of its queue are written), so /metrics never lags the outcome counters. Relies on
    ``prometheus_client``'s histogram layout (``_upper_bounds``, ``_buckets`` counted per bucket,
    ``_sum``); tests/test_metrics_tally.py compares the exposition with ``observe``'s.
    """

    __slots__ = ("_bounds", "_child", "_counts", "_pending", "_sum")

    def __init__(self, child: Histogram) -> None:
        self._child = child
        self._bounds: list[float] = list(child._upper_bounds)
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._pending = False

    def observe(self, amount: float) -> None:
        """Count one observation (``Histogram.observe``: the first bucket whose bound is at
        least ``amount``; the last bound is +Inf)."""
        self._counts[bisect_left(self._bounds, amount)] += 1
        self._sum += amount
        self._pending = True

    def flush(self) -> None:
        """Add what was counted since the last flush to the histogram."""
        if not self._pending:
            return
        child = self._child
        child._sum.inc(self._sum)
        counts = self._counts
        for i, n in enumerate(counts):
            if n:
                child._buckets[i].inc(n)
                counts[i] = 0
        self._sum = 0.0
        self._pending = False
