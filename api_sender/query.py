"""One SQL statement with named parameters: the convention of every statement we write.

A :class:`Query` is written once, as text with ``{s}`` for the queue schema (and ``{channel}`` for
its NOTIFY channels) and ``:name`` for each parameter. :meth:`Query.render` turns it into the text a
driver runs (``$1, $2, ...`` for asyncpg) for one schema, and :meth:`Rendered.args` binds the
parameters by name, so a statement and the values passed to it can never drift apart by position.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .schema import cancel_channel, notify_channel, quoted

#: ``:name`` marks a parameter; ``::type`` (a cast) and ``'HH24:MI'`` (upper case) do not.
_PARAMETER = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)\b")


@dataclass(frozen=True, slots=True)
class Rendered:
    """A query's text for one schema, with its parameter names in placeholder order."""

    name: str
    text: str
    parameters: tuple[str, ...]

    def args(self, values: Mapping[str, Any]) -> list[Any]:
        """The positional arguments for ``values``; every parameter must be given, no other."""
        given = set(values)
        expected = set(self.parameters)
        if given != expected:
            missing = sorted(expected - given)
            extra = sorted(given - expected)
            raise TypeError(f"query {self.name}: missing {missing}, unexpected {extra}")
        return [values[name] for name in self.parameters]


@dataclass(frozen=True, slots=True)
class Query:
    """A named SQL statement with ``:name`` parameters and ``{s}``/``{channel}`` schema slots."""

    name: str
    sql: str

    def render(self, schema: str, **slots: str) -> Rendered:
        """The statement for ``schema`` with ``$n`` placeholders (asyncpg's)."""
        text = self.sql.format(
            s=quoted(schema),
            channel=notify_channel(schema),
            cancel_channel=cancel_channel(schema),
            **slots,
        )
        order: list[str] = []

        def placeholder(match: re.Match[str]) -> str:
            name = match[1]
            if name not in order:
                order.append(name)
            return f"${order.index(name) + 1}"

        return Rendered(self.name, _PARAMETER.sub(placeholder, text), tuple(order))
