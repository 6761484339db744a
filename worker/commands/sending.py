"""What ``chassis-worker send`` accepts: data a handler takes, and usage events as the ingest.

Handlers take ``dict | None``, so the JSON must be an object or null. The usage queue takes only
a usage event the HTTP ingest would accept (``UsageEvent``'s rules), sent the way every usage
event is sent (its id as key, the retry budget): anything else would fail delivery, be held and
be re-driven forever. ``usage-events-held`` takes no sends at all: it is the pipeline's dead
letter, filled by the pipeline, and what lands there goes back to usage-events by itself.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from api_sender import USAGE_HELD_QUEUE, USAGE_QUEUE, InvalidJob, UsageEvent, UsageRetry
from api_sender.options import SendOptions, check_start_after
from api_sender.usage import usage_send_options


def prepare_send(
    queue: str,
    text: str,
    start_after: float | None,
    key: str | None,
    retry: UsageRetry,
    usage_error: type[Exception],
) -> tuple[Any, SendOptions]:
    """The data and options of one send, or ``usage_error`` with a one-line reason (exit 2)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise usage_error(f"invalid JSON argument: {exc}") from None
    except RecursionError:
        raise usage_error("invalid JSON argument: nested too deeply") from None
    try:
        check_start_after(start_after, "--start-after")
    except InvalidJob as exc:
        raise usage_error(f"error: {exc}") from None
    if queue == USAGE_HELD_QUEUE:
        raise usage_error(
            f"error: {USAGE_HELD_QUEUE} is the usage pipeline's dead letter and takes no sends; "
            f"send the event to {USAGE_QUEUE}"
        )
    if queue == USAGE_QUEUE:
        if key is not None:
            raise usage_error(
                f'error: --key is not taken by {USAGE_QUEUE}: an event\'s key is its "id"'
            )
        event = _usage_event(data, usage_error)
        return event.to_job_data(), usage_send_options(event.id, retry, start_after=start_after)
    if data is not None and not isinstance(data, dict):
        raise usage_error(
            f"error: the job data must be a JSON object or null (handlers take a dict or None), "
            f"not {_json_kind(data)}"
        )
    try:
        return data, SendOptions(start_after=start_after, singleton_key=key)
    except InvalidJob as exc:
        raise usage_error(f"error: {exc}".replace("singleton_key", "--key")) from None


def _usage_event(data: Any, usage_error: type[Exception]) -> UsageEvent:
    """``data`` as a usage event, or ``usage_error`` listing every invalid field."""
    if not isinstance(data, dict):
        raise usage_error(f"error: a usage event must be a JSON object, not {_json_kind(data)}")
    try:
        return UsageEvent.model_validate(data)
    except ValidationError as exc:
        problems = []
        for problem in exc.errors():
            field = ".".join(str(part) for part in problem["loc"]) or "(event)"
            message = str(problem["msg"]).removeprefix("Value error, ")
            problems.append(f"{field}: {message}")
        raise usage_error(
            f"error: invalid usage event (nothing enqueued): {'; '.join(problems)}"
        ) from None


def _json_kind(value: Any) -> str:
    """What JSON value ``value`` is, for messages."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, int | float):
        return "a number"
    return "null" if value is None else type(value).__name__
