"""What the timers and the usage sink need of the sender that owns them, as a protocol.

They depend on this narrow surface, not on :class:`api_sender.Sender` or
:class:`api_sender.SyncSender` themselves, so the senders import them and they never import a
sender (no import cycle): a schema, and running an operation on the sender's own executor or on
a caller's ``connection=``.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from .operation import Op

T = TypeVar("T")


class AsyncProducer(Protocol):
    """An async sender (:class:`api_sender.Sender`)."""

    schema: str

    async def run(self, op: Op[T], connection: object | None = None) -> T:
        """Run ``op`` on the sender's pool, or on ``connection`` inside the caller's
        transaction."""
        ...


class SyncProducer(Protocol):
    """A synchronous sender (:class:`api_sender.SyncSender`)."""

    schema: str

    def run(self, op: Op[T], connection: object | None = None) -> T:
        """Run ``op`` on the sender's connection, or on ``connection`` inside the caller's
        transaction."""
        ...
