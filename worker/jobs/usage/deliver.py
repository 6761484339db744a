"""The usage worker: a claimed batch goes to the downstream whole; window holds are held.

Poison events: a downstream that refuses a batch for its content (400, 413, 422) is answered by
splitting the batch in halves and posting each, down to single events, in the same run. The
event the hub refuses alone fails alone (its retry, then the held queue, round after round);
every other event of the batch is delivered. Outages, timeouts and bad credentials are never
split: they fail the whole remaining batch back to its retry at the cost of one request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog

from api_sender import USAGE_HELD_QUEUE, Sender
from api_sender.usage import event_id_of

from ...downstream import ContentRefused, Downstream, DownstreamError
from ...metrics import USAGE_DELIVERED, USAGE_HELD
from ...queue.jobs import ClaimedJob
from .holds import OCCURRED_AT_WINDOW, window_hold_key

log = structlog.get_logger("worker.usage")

#: A job and its decoded event.
Pair = tuple[ClaimedJob, dict[str, Any]]

#: Fraction of the batch's expiry the splitting may use before it fails what is left.
_SPLIT_BUDGET = 0.8


@dataclass
class _Results:
    delivered: list[Pair] = field(default_factory=list)
    duplicates: int = 0
    held: list[tuple[Pair, str]] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)


class UsageDelivery:
    """Runs one claimed batch of the usage queue through the downstream."""

    def __init__(self, downstream: Downstream, sender: Sender) -> None:
        self.downstream = downstream
        self._sender = sender

    async def run_batch(self, jobs: list[ClaimedJob]) -> Mapping[int, str] | None:
        """Deliver the batch; fail the jobs not delivered; send window holds to the held queue.

        Raises (failing every job back to its retry) only when the held sends fail, so a held
        event is never completed without its hold being stored.
        """
        results = _Results()
        pairs: list[Pair] = []
        for job in jobs:
            data = job.data
            if isinstance(data, dict) and event_id_of(data) is not None:
                pairs.append((job, data))
            else:
                results.failed[job.id] = "not a usage event: the job's data has no string id"
                log.error("usage.malformed", job_id=job.id, attempt=job.attempt)
        if pairs:
            expire = min(job.expire_seconds for job, _ in pairs)
            deadline = anyio.current_time() + expire * _SPLIT_BUDGET
            await self._deliver(pairs, results, deadline)
        if results.held:
            await self._hold(results.held)
        if results.delivered:
            USAGE_DELIVERED.inc(len(results.delivered))
            log.info(
                "usage.delivered",
                downstream=self.downstream.name,
                count=len(results.delivered),
                duplicate=results.duplicates,
                ids=[data["id"] for _, data in results.delivered],
            )
        return results.failed or None

    async def _deliver(self, pairs: list[Pair], results: _Results, deadline: float) -> None:
        stack = [pairs]
        first = True
        while stack:
            group = stack.pop()
            if not first and anyio.current_time() >= deadline:
                self._fail_rest(group, stack, results, "splitting a refused batch ran out of time")
                return
            first = False
            try:
                outcome = await self.downstream.deliver([data for _, data in group])
            except ContentRefused as exc:
                if len(group) > 1:
                    middle = len(group) // 2
                    # The first half is posted first: the stack pops from the end.
                    stack.extend([group[middle:], group[:middle]])
                    log.warning(
                        "usage.batch_refused",
                        count=len(group),
                        error=str(exc),
                        hint="the downstream refused the batch's content; posting it in halves "
                        "to find the event it refuses",
                    )
                    continue
                job, data = group[0]
                results.failed[job.id] = str(exc)
                log.error(
                    "usage.event_refused",
                    event_id=data["id"],
                    job_id=job.id,
                    attempt=job.attempt,
                    error=str(exc),
                    hint="the hub refuses this event on its own; it is retried, then held and "
                    "re-driven; see `chassis-worker held list`",
                )
                continue
            except DownstreamError as exc:
                self._fail_rest(group, stack, results, str(exc))
                return
            held = {h.id: h.reason for h in outcome.held}
            for pair in group:
                event_id = pair[1]["id"]
                if event_id in held:
                    results.held.append((pair, held[event_id]))
                else:
                    results.delivered.append(pair)
                    if event_id in outcome.duplicate:
                        results.duplicates += 1

    @staticmethod
    def _fail_rest(
        group: list[Pair], stack: list[list[Pair]], results: _Results, error: str
    ) -> None:
        rest = group + [pair for pending in stack for pair in pending]
        stack.clear()
        for job, _ in rest:
            results.failed[job.id] = error
        log.warning(
            "usage.delivery_failed",
            count=len(rest),
            ids=[data["id"] for _, data in rest],
            attempts=sorted({job.attempt for job, _ in rest}),
            error=error,
            hint="the batch goes back to its retry; after the retry budget it is held, "
            "never dropped",
        )

    async def _hold(self, held: list[tuple[Pair, str]]) -> None:
        ids = [data["id"] for (_, data), _ in held]
        await self._sender.send_many(
            USAGE_HELD_QUEUE,
            [data for (_, data), _ in held],
            singleton_keys=[window_hold_key(event_id) for event_id in ids],
        )
        log.warning(
            "usage.held",
            reason=OCCURRED_AT_WINDOW,
            count=len(held),
            ids=ids,
            hub_reasons=sorted({reason for _, reason in held}),
            hint="the hub refuses these events' occurred_at for now; they are re-driven after "
            "USAGE_HELD_DELAY_SECONDS; check this instance's clock",
        )
        # Counted once the sends are in: a send that raises fails the batch back to its retry,
        # which would hold (and count) these events again.
        USAGE_HELD.labels(OCCURRED_AT_WINDOW).inc(len(held))
