"""Usage downstreams, chosen by ``USAGE_DOWNSTREAM``: one module each.

The hub poster (``.http``) and its HTTP client, httpx, load only when the hub is the
downstream (or ``HubDownstream`` is asked for): a worker that logs or drops usage events never
imports them (about 2 MB of its resident memory).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..settings import Settings
from .base import ContentRefused, Downstream, DownstreamError, EventData, HeldEvent, Outcome
from .log import LogDownstream
from .noop import NoopDownstream

if TYPE_CHECKING:
    from .http import HubDownstream

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
    from .http import HubDownstream

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


def __getattr__(name: str) -> object:
    """``HubDownstream``, imported on first use (see the module docstring)."""
    if name == "HubDownstream":
        from .http import HubDownstream

        return HubDownstream
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
