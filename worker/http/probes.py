"""The answers of /healthz, /readyz and /metrics, apart from any web framework: the Starlette
routes of an api process (:mod:`.health`) and the worker's own listener (:mod:`.probe_server`)
both serve them."""

from __future__ import annotations

import json

import anyio
import structlog
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from ..gauges import SCRAPE_WAIT_SECONDS, QueueGauges
from ..metrics import READY
from ..state import ServiceState

log = structlog.get_logger("worker.metrics")

JSON = "application/json"


def json_body(document: object) -> bytes:
    """Compact JSON, as Starlette's JSONResponse renders it."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


def healthz() -> tuple[int, bytes]:
    """Liveness: the process answers."""
    return 200, json_body({"ok": True})


async def _readiness(state: ServiceState) -> str | None:
    """``state``'s readiness check, with ``worker_ready`` set from it."""
    reason = await state.readiness()
    READY.set(0 if reason else 1)
    return reason


async def readyz(state: ServiceState) -> tuple[int, bytes]:
    """Readiness: 200, or 503 with the reason (and ``worker_ready`` follows)."""
    reason = await _readiness(state)
    if reason is None:
        return 200, json_body({"ready": True})
    return 503, json_body({"ready": False, "reason": reason})


class Metrics:
    """The exposition, after a queue count that may run past the scrape's budget: a count
    slower than ``SCRAPE_WAIT_SECONDS`` finishes in ``task_group`` after the answer and sets
    the gauges for the next scrape."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, state: ServiceState) -> None:
        self._state = state
        self._gauges = QueueGauges(state.settings.jobs_schema)

    async def body(self, task_group: anyio.abc.TaskGroup) -> bytes:
        """The text to answer; ``task_group`` outlives the request."""
        deadline = anyio.current_time() + SCRAPE_WAIT_SECONDS
        counted = self._gauges.start_refresh(self._state.pool, task_group)
        # Scrapes keep worker_ready current: nothing else polls /readyz in a compose stack.
        # Checked while the count runs.
        await _readiness(self._state)
        with anyio.move_on_at(deadline) as budget:
            await counted.wait()
        if budget.cancelled_caught:
            log.info("metrics.count_pending", waited=SCRAPE_WAIT_SECONDS)
        return generate_latest(REGISTRY)
