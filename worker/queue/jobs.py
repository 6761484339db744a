"""A claimed job as the consumer sees it, and what its runner may raise to fail it for good."""

from __future__ import annotations

import json
import json.scanner
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from ..declarations import JobInfo, job_info

#: The claim statements' job columns, in their order (``_JOB_COLUMNS`` of ``worker.queue.sql``).
JOB_COLUMNS = (
    "id",
    "data",
    "attempt",
    "retry_count",
    "retry_limit",
    "singleton_key",
    "expire_seconds",
    "priority",
    "claim",
)

#: PostgreSQL's epoch: a ``timestamptz`` is stored (and sent in binary) as signed microseconds
#: since this instant.
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def claim_token(instant: datetime) -> bytes:
    """``timestamptz_send(instant)``: the 8 bytes a claim's fence carries for its instant."""
    return ((instant - _PG_EPOCH) // _MICROSECOND).to_bytes(8, "big", signed=True)


def claim_instant(token: bytes) -> datetime:
    """The instant of a claim token (:func:`claim_token` reversed)."""
    return _PG_EPOCH + timedelta(microseconds=int.from_bytes(token, "big", signed=True))


#: The C scanner that ``json.loads`` itself runs, called directly (see :func:`decode_payload`).
#: (typeshed declares make_scanner as taking another scanner; it takes the decoder.)
_scan: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(
    json.JSONDecoder()  # type: ignore[arg-type]
)


def decode_payload(text: str) -> Any:
    """``json.loads(text)``, a quarter of its cost for a small payload: the scanner straight on
    the text (PostgreSQL's jsonb text has no surrounding whitespace); anything else (leading or
    trailing whitespace, extra data, invalid JSON) goes through ``json.loads`` itself, so the
    value and the errors are exactly its own."""
    try:
        value, end = _scan(text, 0)
    except (StopIteration, ValueError):
        return json.loads(text)
    if end != len(text):
        return json.loads(text)
    return value


@dataclass(slots=True)
class ClaimedJob:
    """One job this process claimed; ``(id, attempt, claim)`` with the owner id is its fence.
    ``claim`` is the claim's own instant (``started_at``, as :func:`claim_token` bytes, which the
    worker only hands back): a claim lost in a server crash and taken again under the same
    attempt number has another, so the first run's outcome matches nothing.
    """

    id: int
    queue: str
    attempt: int
    retry_count: int
    retry_limit: int
    singleton_key: str | None
    expire_seconds: int
    priority: int
    raw_data: str | None
    #: When this claim was made (the database's clock), as the claim returned it: the 8 bytes of
    #: ``timestamptz_send(started_at)``.
    claim: bytes

    @classmethod
    def from_values(cls, queue: str, values: tuple[Any, ...]) -> ClaimedJob:
        """Build from a claim row's job columns as a tuple in :data:`JOB_COLUMNS` order (by
        position: a quarter of the cost of looking each column up by name)."""
        (
            job_id,
            raw_data,
            attempt,
            retry_count,
            retry_limit,
            singleton_key,
            expire_seconds,
            priority,
            claim,
        ) = values
        return cls(
            job_id,
            queue,
            attempt,
            retry_count,
            retry_limit,
            singleton_key,
            expire_seconds,
            priority,
            raw_data,
            claim,
        )

    @classmethod
    def from_row(cls, queue: str, row: asyncpg.Record) -> ClaimedJob:
        """Build from a claim statement's row, by column name."""
        return cls(
            id=row["id"],
            queue=queue,
            attempt=row["attempt"],
            retry_count=row["retry_count"],
            retry_limit=row["retry_limit"],
            singleton_key=row["singleton_key"],
            expire_seconds=row["expire_seconds"],
            priority=row["priority"],
            raw_data=row["data"],
            claim=row["claim"],
        )

    @property
    def started_at(self) -> datetime:
        """When this claim was made (decoded from :attr:`claim`)."""
        return claim_instant(self.claim)

    @property
    def data(self) -> Any:
        """The decoded payload (``None`` for a cron run)."""
        return None if self.raw_data is None else decode_payload(self.raw_data)

    def info(self) -> JobInfo:
        """The public view a handler receives."""
        return job_info(self.id, self.queue, self.singleton_key, self.attempt, self.retry_count)


class FinalFailure(Exception):
    """Raised by a job runner when the job can never succeed (its payload does not validate):
    the job fails at once, with no retry, to its dead letter; ``error`` is its error text."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error
