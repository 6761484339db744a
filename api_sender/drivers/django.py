"""Django's ``django.db.connection`` (or ``connections[alias]``) on the postgresql backend with
psycopg 3. Inside ``transaction.atomic()`` the send is part of that transaction."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from django.db import transaction

from ..operation import Rows, Step
from .base import Bound, SyncDriver, what


def sync_driver(connection: Any, schema: str, accepted: str) -> SyncDriver:
    """The driver of a Django database connection (``django.db.connection``)."""
    vendor = getattr(connection, "vendor", None)
    if vendor is None or not hasattr(connection, "cursor") or not hasattr(connection, "alias"):
        raise TypeError(f"connection= takes {accepted}, not {what(connection)}")
    if vendor != "postgresql":
        raise TypeError(f"a Django connection to {vendor} cannot send: it needs postgresql")
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:
        raise TypeError(
            "Django's postgresql backend is running on psycopg2, which is not supported; "
            "install psycopg 3 (Django uses it when it is installed)"
        )
    return DjangoDriver(connection, schema)


class DjangoDriver(Bound):
    """A Django connection; its transaction (``transaction.atomic()``) is the caller's."""

    style = "format"

    def __init__(self, connection: Any, schema: str) -> None:
        super().__init__(schema)
        self._connection = connection

    def execute(self, step: Step) -> Rows:
        text, args = self.bind(step)
        with self._connection.cursor() as cursor:
            cursor.execute(text, args)
            if cursor.description is None:
                return []
            names = [column[0] for column in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def scope(self, atomic: bool) -> AbstractContextManager[SyncDriver] | None:
        return self._atomic() if atomic else None

    @contextmanager
    def _atomic(self) -> Iterator[SyncDriver]:
        # A savepoint inside the caller's atomic block, or a transaction of its own.
        with transaction.atomic(using=self._connection.alias):
            yield self
