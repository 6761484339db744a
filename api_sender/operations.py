"""The producer's operations, each written once: send, send_many, timers.schedule/cancel.

Each function validates its input at once (:class:`~api_sender.InvalidJob` naming the field,
before any I/O), and returns an :class:`~api_sender.operation.Op` that the async
:class:`~api_sender.Sender` and the synchronous :class:`~api_sender.SyncSender` run on their
driver (:mod:`api_sender.driver`).
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from datetime import datetime
from typing import Any

from . import sql
from .errors import InvalidJob, QueueNotFound, sender_error
from .operation import ErrorMap, Op, Row, Rows, Step, first, one
from .options import SendOptions, check_text, encode_all, encode_data, split_start_after


def send(schema: str, queue: str, data: Any, options: SendOptions) -> Op[int | None]:
    """Enqueue one job: its id, or ``None`` when the queue's policy refused its key."""
    check_text("queue", queue, optional=False)
    values = {"queue": queue, "data": encode_data(data), **options.values()}

    def decode(rows: Rows) -> int | None:
        row = found(first(rows), queue, schema)
        job_id: int | None = row["id"]
        return job_id

    return one(sql.SEND, values, decode, errors=enqueue_errors(queue, schema), alone=sql.SEND_ALONE)


def send_many(
    schema: str,
    queue: str,
    items: Iterable[Any],
    options: SendOptions,
    singleton_keys: Sequence[str | None] | None = None,
) -> Op[list[int]]:
    """Enqueue one job per item in one statement: their ids in order (refused keys left out)."""
    check_text("queue", queue, optional=False)
    payloads = encode_all(items)
    keys = check_keys(singleton_keys, len(payloads))
    values = {"queue": queue, "items": payloads, "keys": keys, **options.values()}

    def steps() -> Generator[Step, Rows, list[int]]:
        if not payloads:
            return []
        row = found(first((yield Step(sql.SEND_MANY, values, sql.SEND_MANY_ALONE))), queue, schema)
        return list(row["ids"])

    return Op(steps(), errors=enqueue_errors(queue, schema))


def schedule_timer(
    schema: str,
    queue: str,
    *,
    at: datetime | None = None,
    delay_seconds: float | None = None,
    data: Any = None,
    key: str | None = None,
) -> Op[int]:
    """Schedule a timer; with ``key`` the unfinished timer of that key is cancelled by the same
    statement, whose transaction holds the key's lock until it ends (see ``Timers.schedule``)."""
    if (at is None) == (delay_seconds is None):
        raise InvalidJob("give exactly one of at= and delay_seconds=", "at")
    check_text("queue", queue, optional=False)
    if at is not None:
        delay, instant = split_start_after(at, "at")
    else:
        delay, instant = split_start_after(delay_seconds, "delay_seconds")
    check_text("key", key)
    values = {"queue": queue, "data": encode_data(data), "key": key, "at": instant, "delay": delay}

    def decode(rows: Rows) -> int:
        job_id: int = found(first(rows), queue, schema)["id"]
        return job_id

    # One statement: a keyed replace (lock, cancel, insert) is atomic by itself, and inside the
    # caller's transaction the key lock lasts until the caller's commit.
    return one(sql.SEND_TIMER, values, decode, errors=enqueue_errors(queue, schema))


def cancel_timer(schema: str, queue: str, key: str) -> Op[bool]:
    """Cancel the unfinished timer ``key`` of ``queue``: whether there was one."""
    check_text("queue", queue, optional=False)
    check_text("key", key, optional=False)

    def decode(rows: Rows) -> bool:
        return bool(first(rows)["cancelled"])

    return one(
        sql.CANCEL_TIMER, {"queue": queue, "key": key}, decode, errors=enqueue_errors(queue, schema)
    )


def found(row: Row, queue: str, schema: str) -> Row:
    """``row`` of an enqueue statement whose queue exists, else :class:`QueueNotFound`."""
    if not row["queue_found"]:
        raise QueueNotFound(queue, schema)
    return row


def enqueue_errors(queue: str, schema: str) -> ErrorMap:
    """The error map of the enqueue functions: P0002 is QueueNotFound for ``queue``, 22023 is
    InvalidJob naming the field (:func:`~api_sender.errors.sender_error`)."""

    def mapped(sqlstate: str, exc: BaseException) -> Exception | None:
        return sender_error(exc, queue=queue, schema=schema)

    return mapped


def check_keys(keys: Sequence[str | None] | None, count: int) -> list[str | None] | None:
    """The per-item singleton keys as a statement parameter, validated against the item count."""
    if keys is None:
        return None
    if isinstance(keys, str):
        raise InvalidJob(
            "singleton_keys must be a sequence of keys, not a string", "singleton_keys"
        )
    checked = list(keys)
    if len(checked) != count:
        raise InvalidJob(
            f"singleton_keys has {len(checked)} entries for {count} items", "singleton_keys"
        )
    for n, key in enumerate(checked):
        check_text(f"singleton_keys.{n}", key)
    return checked
