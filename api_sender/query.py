"""One SQL statement with named parameters: the convention of every statement we write.

A :class:`Query` is written once, as text with ``{s}`` for the queue schema (and ``{channel}`` for
its NOTIFY channels) and ``:name`` for each parameter. :meth:`Query.render` turns it into the text a
driver runs for one schema, in the driver's placeholder style (``$1, $2, ...`` for asyncpg, ``%s``
for psycopg 3, Django and SQLAlchemy over psycopg), and :meth:`Rendered.args` binds the parameters
by name, so a statement and the values passed to it can never drift apart by position.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .schema import cancel_channel, notify_channel, quoted

#: ``:name`` marks a parameter; ``::type`` (a cast) does not, nor anything in a ``'literal'`` or
#: a ``-- comment`` (matched whole, first, and left as they are).
_PARAMETER = re.compile(r"'(?:[^']|'')*'|--[^\n]*|(?<![:\w]):([a-z_][a-z0-9_]*)\b")

#: How a driver spells a parameter: ``$n`` (asyncpg, numbered: a name used twice is one
#: parameter) or ``%s`` (psycopg, positional: a name used twice is passed twice, and a literal
#: ``%`` in the text is doubled).
Paramstyle = Literal["dollar", "format"]


@dataclass(frozen=True, slots=True)
class Rendered:
    """A query's text for one schema, with its parameter names in placeholder order (for the
    ``format`` style a name occurs once per placeholder)."""

    name: str
    text: str
    parameters: tuple[str, ...]
    #: How many distinct parameters (a name occurs once per placeholder in the format style).
    distinct: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "distinct", len(set(self.parameters)))

    def args(self, values: Mapping[str, Any]) -> list[Any]:
        """The positional arguments for ``values``; every parameter must be given, no other."""
        try:
            out = [values[name] for name in self.parameters]
        except KeyError:
            out = None
        if out is None or len(values) != self.distinct:
            given = set(values)
            expected = set(self.parameters)
            missing = sorted(expected - given)
            extra = sorted(given - expected)
            raise TypeError(f"query {self.name}: missing {missing}, unexpected {extra}")
        return out


@dataclass(frozen=True, slots=True)
class Query:
    """A named SQL statement with ``:name`` parameters and ``{s}``/``{channel}`` schema slots."""

    name: str
    sql: str

    def render(self, schema: str, *, style: Paramstyle = "dollar", **slots: str) -> Rendered:
        """The statement for ``schema`` with ``$n`` placeholders (asyncpg's), or with ``%s``
        placeholders for ``style="format"`` (psycopg's)."""
        text = self.sql.format(
            s=quoted(schema),
            channel=notify_channel(schema),
            cancel_channel=cancel_channel(schema),
            **slots,
        )
        order: list[str] = []
        if style == "format":

            def positional(match: re.Match[str]) -> str:
                if match[1] is None:
                    return match[0]
                order.append(match[1])
                return "%s"

            text = _PARAMETER.sub(positional, text.replace("%", "%%"))
            return Rendered(self.name, text, tuple(order))

        def placeholder(match: re.Match[str]) -> str:
            name = match[1]
            if name is None:
                return match[0]
            if name not in order:
                order.append(name)
            return f"${order.index(name) + 1}"

        return Rendered(self.name, _PARAMETER.sub(placeholder, text), tuple(order))
