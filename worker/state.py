"""What the HTTP layer needs to know about the running process, set as boot progresses."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import asyncpg

from api_sender import Sender

from .metrics import READY
from .settings import Settings


@dataclass
class ServiceState:
    """Readiness and the handles a request may use (``None`` until the database is reached)."""

    settings: Settings
    pool: asyncpg.Pool | None = None
    sender: Sender | None = None
    #: Why the process is not ready; ``None`` once boot finished.
    not_ready_reason: str | None = "starting"
    #: Extra live checks (the worker's listener); each returns a reason or ``None``.
    checks: list[Callable[[], str | None]] = field(default_factory=list)

    def set_reason(self, reason: str | None) -> None:
        """Record the boot stage that keeps the process from being ready."""
        self.not_ready_reason = reason
        READY.set(0 if reason else 1)

    async def readiness(self) -> str | None:
        """``None`` when ready, else the reason /readyz gives."""
        if self.not_ready_reason is not None:
            return self.not_ready_reason
        for check in self.checks:
            reason = check()
            if reason is not None:
                return reason
        if self.pool is None:
            return "database unreachable"
        try:
            with anyio.fail_after(2.0):
                await self.pool.fetchval("SELECT 1")
        except Exception:
            return "database unreachable"
        return None
