"""What the timers and the usage sink need of the sender that owns them, as a protocol.

They depend on this narrow surface, not on :class:`api_sender.Sender` itself, so the sender
imports them and they never import the sender (no import cycle).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import asyncpg

from .options import SendOptions
from .sql import SenderStatements


class Producer(Protocol):
    """A sender: its schema, pool and statements, and its two ways of sending."""

    schema: str

    @property
    def pool(self) -> asyncpg.Pool:
        """The pool it sends through."""
        ...

    @property
    def statements(self) -> SenderStatements:
        """Its rendered producer statements."""
        ...

    async def send_with(
        self,
        queue: str,
        data: Any,
        options: SendOptions,
        *,
        connection: asyncpg.Connection | None = None,
    ) -> int | None:
        """Send one job (see ``Sender.send``)."""
        ...

    async def send_many_with(
        self,
        queue: str,
        items: Iterable[Any],
        options: SendOptions,
        *,
        singleton_keys: Sequence[str | None] | None = None,
        connection: asyncpg.Connection | None = None,
    ) -> list[int]:
        """Send many jobs in one statement (see ``Sender.send_many``)."""
        ...
