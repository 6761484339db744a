"""``USAGE_DOWNSTREAM=http``: the hub poster (contract section 6).

A batch is posted whole as ``{"events": [...]}`` with Basic auth and a JSON body. Only a 2xx
answer of the documented shape delivers anything; any other status, a malformed 2xx, a timeout
or a network error raises, and the usage worker sends the batch back to its retry.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import httpx
import structlog
from pydantic import SecretStr

from .base import ContentRefused, DownstreamError, EventData, HeldEvent, Outcome

log = structlog.get_logger("worker.downstream")

#: Statuses that blame the batch's content, not the hub or the credentials: worth splitting.
CONTENT_STATUSES = frozenset({400, 413, 422})


class HubDownstream:
    """Posts batches to the billing hub over one reused ``httpx.AsyncClient``."""

    name = "http"

    def __init__(
        self,
        url: str,
        client_id: str,
        client_secret: SecretStr,
        *,
        timeout: float,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url
        self.timeout = timeout
        #: The URL as logs show it: any user-info in it is cut off.
        self.shown_url = _without_userinfo(url)
        # The secret goes into the client's auth and nowhere else: never into a log field, an
        # error message or the repr of this object.
        self._client = httpx.AsyncClient(
            auth=httpx.BasicAuth(client_id, client_secret.get_secret_value()),
            timeout=httpx.Timeout(timeout),
            headers={"User-Agent": "chassis-worker", "Accept": "application/json"},
            transport=transport,
            follow_redirects=False,
        )

    def __repr__(self) -> str:
        return f"HubDownstream(url={self.shown_url!r}, timeout={self.timeout})"

    async def deliver(self, events: Sequence[EventData]) -> Outcome:
        """Post ``events`` as one batch and parse the hub's answer; raise if not delivered."""
        body = json.dumps({"events": [dict(e) for e in events]}, separators=(",", ":"))
        try:
            # httpx's timeout bounds each phase (connect, each read); this bounds the whole
            # exchange, so a hub that trickles bytes cannot hold the batch past the timeout.
            with anyio.fail_after(self.timeout):
                response = await self._client.post(
                    self.url, content=body, headers={"Content-Type": "application/json"}
                )
        except TimeoutError:
            raise DownstreamError(f"hub {self.shown_url} timed out after {self.timeout}s") from None
        except httpx.TimeoutException:
            raise DownstreamError(f"hub {self.shown_url} timed out after {self.timeout}s") from None
        except httpx.HTTPError as exc:
            raise DownstreamError(
                f"hub {self.shown_url} unreachable: {type(exc).__name__}: {exc}"
            ) from None
        return self._outcome(response, {str(e["id"]) for e in events})

    def _outcome(self, response: httpx.Response, sent: set[str]) -> Outcome:
        status = response.status_code
        if not 200 <= status < 300:
            excerpt = response.text[:200].replace("\n", " ")
            message = f"hub {self.shown_url} answered {status}: {excerpt}"
            if status in CONTENT_STATUSES:
                raise ContentRefused(message)
            raise DownstreamError(message)
        try:
            answer = json.loads(response.content)
        except ValueError:
            raise DownstreamError(
                f"hub {self.shown_url} answered {status} with a body that is not JSON"
            ) from None
        outcome = parse_answer(answer)
        if outcome is None:
            raise DownstreamError(
                f"hub {self.shown_url} answered {status} with a malformed body: "
                f"{response.text[:200]}"
            )
        unknown = (outcome.accepted | outcome.duplicate | outcome.held_ids) - sent
        if unknown:
            log.warning("usage.hub_unknown_ids", ids=sorted(unknown)[:50], count=len(unknown))
        return outcome

    async def aclose(self) -> None:
        """Close the client's connections."""
        await self._client.aclose()


def parse_answer(answer: Any) -> Outcome | None:
    """The outcome a 2xx body describes, or ``None`` when it is not of the documented shape.

    ``{"accepted": [id...], "duplicate": [id...], "held": [{"id": ..., "reason": ...}]}``, each
    list optional; unknown keys are ignored so a newer hub can add some.
    """
    if not isinstance(answer, dict):
        return None
    accepted = _ids(answer.get("accepted", []))
    duplicate = _ids(answer.get("duplicate", []))
    raw_held = answer.get("held", [])
    if accepted is None or duplicate is None or not isinstance(raw_held, list):
        return None
    held: list[HeldEvent] = []
    for entry in raw_held:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            return None
        reason = entry.get("reason", "unspecified")
        held.append(HeldEvent(entry["id"], reason if isinstance(reason, str) else str(reason)))
    return Outcome(accepted=accepted, duplicate=duplicate, held=tuple(held))


def _ids(value: Any) -> frozenset[str] | None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return frozenset(value)


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
