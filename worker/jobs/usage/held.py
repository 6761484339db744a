"""The held worker: every held event goes back to the usage queue after the hold, forever.

Two kinds of job land on the held queue: the dead-letter copy of a batch that ran out of retries
(no singleton key; a retry-budget hold, logged at error and counted here) and the usage worker's
window hold (key ``occurred_at_window:<id>``; logged and counted where it was held, so only
re-driven here: counting it again would call it a retry-budget hold, which it is not).
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from api_sender import Sender, UsageRetry

from ...metrics import USAGE_HELD
from ...queue.jobs import ClaimedJob
from .holds import RETRY_BUDGET, hold_reason, shown_id

log = structlog.get_logger("worker.usage")

BUDGET_HINT = (
    "the hub did not take these events within the retry budget; check the hub (is HUB_URL up "
    "and answering 2xx?), HUB_CLIENT_ID/HUB_CLIENT_SECRET, and this instance's registry entry "
    "at the hub; the events are re-driven after USAGE_HELD_DELAY_SECONDS, never dropped"
)


class HeldRedrive:
    """Runs one claimed batch of the held queue: re-send, then log and count."""

    def __init__(self, sender: Sender, retry: UsageRetry) -> None:
        self._sender = sender
        self._retry = retry

    async def run_batch(self, jobs: list[ClaimedJob]) -> Mapping[int, str] | None:
        """Re-send every held event to the usage queue, due after the hold, in one statement."""
        payloads = [job.data for job in jobs]
        delay = self._retry.held_delay_seconds
        await self._sender.usage.resend(payloads, start_after=delay)
        budget = [
            shown_id(data, job.id)
            for job, data in zip(jobs, payloads, strict=True)
            if hold_reason(job.singleton_key) == RETRY_BUDGET
        ]
        if budget:
            log.error(
                "usage.held",
                reason=RETRY_BUDGET,
                count=len(budget),
                ids=budget,
                retry_after_seconds=delay,
                hint=BUDGET_HINT,
            )
            # Counted once the re-sends are in: a re-send that raises fails this held batch
            # back to its own retry, which re-sends (and would count) the whole batch again.
            USAGE_HELD.labels(RETRY_BUDGET).inc(len(budget))
        log.info(
            "usage.redriven",
            count=len(jobs),
            ids=[shown_id(data, job.id) for job, data in zip(jobs, payloads, strict=True)],
            retry_after_seconds=delay,
        )
        return None
