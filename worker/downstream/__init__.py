"""Usage downstreams, chosen by ``USAGE_DOWNSTREAM``: one module each."""

from __future__ import annotations

from ..settings import Settings
from .base import ContentRefused, Downstream, DownstreamError, EventData, HeldEvent, Outcome
from .http import HubDownstream
from .log import LogDownstream
from .noop import NoopDownstream

__all__ = [
    "ContentRefused",
    "Downstream",
    "DownstreamError",
    "EventData",
    "HeldEvent",
    "HubDownstream",
    "LogDownstream",
    "NoopDownstream",
    "Outcome",
    "make_downstream",
]


def make_downstream(settings: Settings) -> Downstream:
    """The downstream ``USAGE_DOWNSTREAM`` names, configured from ``settings``."""
    if settings.usage_downstream == "noop":
        return NoopDownstream()
    if settings.usage_downstream == "log":
        return LogDownstream()
    # Settings refuse USAGE_DOWNSTREAM=http without all three at boot.
    assert settings.hub_url is not None
    assert settings.hub_client_id is not None
    assert settings.hub_client_secret is not None
    return HubDownstream(
        settings.hub_url,
        settings.hub_client_id,
        settings.hub_client_secret,
        timeout=settings.hub_timeout_seconds,
    )
