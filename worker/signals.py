"""SIGTERM/SIGINT: the first asks for a graceful stop, a second forces the exit."""

from __future__ import annotations

import os
import signal

import anyio
import structlog

log = structlog.get_logger("worker.signals")

#: Exit status of a forced stop (second signal): "anything else" in the contract's terms.
FORCED_EXIT = 1


class StopRequest:
    """Set once a stop is requested."""

    def __init__(self) -> None:
        self.requested = anyio.Event()
        self.signals = 0

    def request(self, reason: str) -> None:
        """Ask for a graceful stop."""
        if not self.requested.is_set():
            log.info("shutdown.requested", reason=reason)
            self.requested.set()


async def watch_signals(stop: StopRequest) -> None:
    """Turn the first SIGTERM/SIGINT into a graceful stop; exit at once on the second."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
        async for signum in received:
            stop.signals += 1
            name = signal.Signals(signum).name
            if stop.signals == 1:
                stop.request(name)
            else:
                log.warning("shutdown.forced", signal=name)
                os._exit(FORCED_EXIT)
