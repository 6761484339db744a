"""Deleting a table's tail in short batches, bounded in statements, time and loops."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg

from api_sender.query import Rendered

from ...db import statements as db
from .runs import PurgeRun


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """How far one run may go: rows per statement, statements per run, seconds per run."""

    #: Rows one DELETE removes at most; small enough that a statement takes milliseconds.
    batch_size: int = 5000
    #: Statements one run issues at most, whatever happens to the clock.
    max_batches: int = 10_000
    #: Seconds after which no new batch starts; the rest waits for the next run.
    time_budget_seconds: float = 600.0
    #: Client-side cap on one statement (asyncpg cancels it): far above a healthy batch, below a
    #: typical server statement_timeout of a minute.
    statement_timeout_seconds: float = 30.0


class StatementTimeout(Exception):
    """A purge statement ran past its cap and was cancelled; its rows wait for the next run."""


@contextmanager
def capped(seconds: float, what: str) -> Iterator[None]:
    """Report an asyncpg ``timeout=seconds`` expiry inside the block as :class:`StatementTimeout`.

    The poller reads a bare ``TimeoutError`` as the job's own expiry; this names the statement.
    """
    try:
        yield
    except TimeoutError:
        raise StatementTimeout(f"{what} ran past {seconds:g}s and was cancelled") from None


def affected(status: str) -> int:
    """The row count of a ``DELETE n`` / ``UPDATE n`` command status."""
    return int(status.rsplit(" ", 1)[-1])


async def drain(
    conn: asyncpg.Connection,
    run: PurgeRun,
    statement: Rendered,
    values: dict[str, Any],
    limits: BatchLimits,
) -> None:
    """Run ``statement`` with ``values`` and ``limit`` (the batch size) until a batch comes up
    short.

    Each batch commits on its own, so a failure keeps what earlier batches did and a long drain
    never holds one transaction open. Records ``batches`` and ``longest_statement_seconds`` in
    ``run.details`` and clears ``run.drained`` when a cap stopped the loop first.
    """
    started = time.monotonic()
    batches = 0
    longest = 0.0
    run.drained = False
    while batches < limits.max_batches:
        if batches and time.monotonic() - started >= limits.time_budget_seconds:
            break
        began = time.perf_counter()
        cap = limits.statement_timeout_seconds
        with capped(cap, "a purge batch"):
            status = await db.execute(
                conn, statement, timeout=cap, limit=limits.batch_size, **values
            )
        longest = max(longest, time.perf_counter() - began)
        batches += 1
        rows = affected(status)
        run.count(rows)
        if rows < limits.batch_size:
            run.drained = True
            break
    run.details["batches"] = batches
    run.details["longest_statement_seconds"] = round(longest, 4)
