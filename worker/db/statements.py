"""Run a rendered statement with its parameters given by name: the worker's one way to query.

Every statement of the worker is an :class:`api_sender.query.Query` (``:name`` parameters),
rendered once per schema. These four functions are the seam between it and the driver: they
bind the values by name (a missing or unexpected one is a ``TypeError`` before the database is
asked) and run the text on an :class:`Executor`, which an asyncpg pool and an asyncpg connection
both are. Nothing else in the worker passes positional ``$n`` arguments.
"""

from __future__ import annotations

from typing import Any, Protocol

from api_sender.query import Rendered


class Executor(Protocol):
    """What the worker needs of a driver: asyncpg's four ways of running one statement."""

    async def fetch(self, query: str, *args: Any, timeout: float | None = None) -> list[Any]:
        """Every row."""
        ...

    async def fetchrow(self, query: str, *args: Any, timeout: float | None = None) -> Any:
        """The first row, or ``None``."""
        ...

    async def fetchval(self, query: str, *args: Any, timeout: float | None = None) -> Any:
        """The first column of the first row, or ``None``."""
        ...

    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str:
        """The command status (``DELETE 3``)."""
        ...


async def fetch(
    executor: Executor, statement: Rendered, /, *, timeout: float | None = None, **values: Any
) -> list[Any]:
    """Every row of ``statement`` run with ``values``."""
    return await executor.fetch(statement.text, *statement.args(values), timeout=timeout)


async def fetchrow(
    executor: Executor, statement: Rendered, /, *, timeout: float | None = None, **values: Any
) -> Any:
    """The first row of ``statement`` run with ``values`` (``None`` when there is none)."""
    return await executor.fetchrow(statement.text, *statement.args(values), timeout=timeout)


async def fetchval(
    executor: Executor, statement: Rendered, /, *, timeout: float | None = None, **values: Any
) -> Any:
    """The first value of ``statement`` run with ``values``."""
    return await executor.fetchval(statement.text, *statement.args(values), timeout=timeout)


async def execute(
    executor: Executor, statement: Rendered, /, *, timeout: float | None = None, **values: Any
) -> str:
    """Run ``statement`` with ``values``; return its command status."""
    status: str = await executor.execute(statement.text, *statement.args(values), timeout=timeout)
    return status
