"""A producer operation, written once and run by any driver (sans-IO).

An :class:`Op` is a generator of :class:`Step` values, each one statement (a
:class:`~api_sender.query.Query` and its values by name): a runner executes each step on its
driver and sends the rows back in, and the generator's return value is the operation's result.
The operation validates its input, builds its statements and decodes their rows; it never does
I/O, so the async :class:`~api_sender.Sender` and the synchronous
:class:`~api_sender.SyncSender` run the very same operations (:mod:`api_sender.driver`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .query import Query

T = TypeVar("T")

#: One row of a statement's answer, by column name (an asyncpg Record, a psycopg dict row, a
#: SQLAlchemy RowMapping, a dict).
Row = Mapping[str, Any]
Rows = Sequence[Row]

#: What an operation makes of a database error with this SQLSTATE (``None``: raise it as is).
ErrorMap = Callable[[str, BaseException], Exception | None]


@dataclass(frozen=True, slots=True)
class Step:
    """One statement of an operation: the query and its parameter values by name.

    ``alone`` is the same statement's form for a connection in no transaction of the
    caller's (a sender's own pool or autocommit connection), where an error aborts nothing
    else; a driver runs it there instead of ``query`` when it is given.
    """

    query: Query
    values: Mapping[str, Any]
    alone: Query | None = None


class Op(Generic[T]):
    """An operation: its steps, whether they must run in one transaction, and its error map.

    ``atomic`` operations run inside a transaction of their own, or a savepoint when the
    caller's connection is already in one (the caller's commit then decides).
    """

    __slots__ = ("_result", "_steps", "atomic", "errors")

    def __init__(
        self,
        steps: Generator[Step, Rows, T],
        *,
        atomic: bool = False,
        errors: ErrorMap | None = None,
    ) -> None:
        self._steps = steps
        self._result: T | None = None
        self.atomic = atomic
        self.errors = errors

    def start(self) -> Step | None:
        """The first statement, or ``None`` when the operation needs none (its result is set)."""
        return self._advance(None)

    def send(self, rows: Rows) -> Step | None:
        """Feed the rows of the last statement; the next statement, or ``None`` when done."""
        return self._advance(rows)

    def result(self) -> T:
        """The operation's result, once :meth:`start`/:meth:`send` returned ``None``."""
        return self._result  # type: ignore[return-value]

    def _advance(self, rows: Rows | None) -> Step | None:
        try:
            return self._steps.send(rows)  # type: ignore[arg-type]
        except StopIteration as stop:
            self._result = stop.value
            return None

    def failed(self, exc: Exception) -> Exception:
        """The exception to raise for ``exc``: this operation's own error for a database error
        its map knows (by SQLSTATE, whatever driver or wrapper raised it), else ``exc``."""
        if self.errors is None:
            return exc
        found = sqlstate_of(exc)
        if found is None:
            return exc
        mapped = self.errors(*found)
        if mapped is None:
            return exc
        mapped.__cause__ = None
        mapped.__suppress_context__ = True
        return mapped


def one(
    query: Query,
    values: Mapping[str, Any],
    decode: Callable[[Rows], T],
    *,
    errors: ErrorMap | None = None,
    alone: Query | None = None,
) -> Op[T]:
    """The operation of a single statement whose rows ``decode`` turns into the result."""
    return _OneStatement(Step(query, values, alone), decode, errors)


class _OneStatement(Op[T]):
    """An :class:`Op` of one statement, without a generator (the hot path of a send)."""

    __slots__ = ("_decode", "_step")

    def __init__(self, step: Step, decode: Callable[[Rows], T], errors: ErrorMap | None) -> None:
        self._step = step
        self._decode = decode
        self._result: T | None = None
        self.atomic = False
        self.errors = errors

    def start(self) -> Step | None:
        return self._step

    def send(self, rows: Rows) -> Step | None:
        self._result = self._decode(rows)
        return None


def first(rows: Rows) -> Row:
    """The one row a statement that always answers one row answered."""
    assert rows, "the statement answered no row"
    return rows[0]


def sqlstate_of(exc: BaseException) -> tuple[str, BaseException] | None:
    """The SQLSTATE of a database error and the driver's own exception carrying it.

    asyncpg and psycopg put it on the exception (``sqlstate``); SQLAlchemy wraps the driver's
    exception (``orig``), Django chains it (``__cause__``); the innermost one is returned.
    """
    found: tuple[str, BaseException] | None = None
    current: BaseException | None = exc
    for _ in range(6):
        if current is None:
            break
        code = getattr(current, "sqlstate", None) or getattr(current, "pgcode", None)
        if isinstance(code, str) and len(code) == 5:
            found = (code, current)
        inner = getattr(current, "orig", None)
        current = inner if isinstance(inner, BaseException) else current.__cause__
    return found
