"""The driver protocol (:mod:`api_sender.driver`): what a driver is and what all share."""

from __future__ import annotations

import functools
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Protocol

from ..operation import Rows, Step
from ..query import Paramstyle, Query, Rendered


@functools.lru_cache(maxsize=1024)
def rendered(query: Query, schema: str, style: Paramstyle) -> Rendered:
    """``query`` for one schema and placeholder style, rendered once."""
    return query.render(schema, style=style)


class Bound:
    """What every driver shares: its schema and placeholder style, and binding a step."""

    style: Paramstyle = "dollar"

    def __init__(self, schema: str) -> None:
        self.schema = schema

    def bind(self, step: Step, alone: bool = False) -> tuple[str, list[Any]]:
        """The statement text and its positional arguments; with ``alone`` (the connection is
        in no transaction of the caller's) the step's ``alone`` form when it has one."""
        query = step.alone if alone and step.alone is not None else step.query
        sql = rendered(query, self.schema, self.style)
        return sql.text, sql.args(step.values)


class AsyncDriver(Protocol):
    """Runs statements on an async connection or pool."""

    schema: str

    async def execute(self, step: Step) -> Rows:
        """Run one statement and return its rows."""
        ...

    def scope(self, atomic: bool) -> AbstractAsyncContextManager[AsyncDriver] | None:
        """The context one operation runs in, or ``None`` to run it on this driver as is."""
        ...


class SyncDriver(Protocol):
    """Runs statements on a synchronous connection."""

    schema: str

    def execute(self, step: Step) -> Rows:
        """Run one statement and return its rows."""
        ...

    def scope(self, atomic: bool) -> AbstractContextManager[SyncDriver] | None:
        """The context one operation runs in, or ``None`` to run it on this driver as is."""
        ...


def what(connection: object) -> str:
    """A connection's type, for an error message."""
    return f"{type(connection).__module__}.{type(connection).__qualname__}"
