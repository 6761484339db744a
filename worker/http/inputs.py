"""Checks of the untrusted text in paths, query strings, forms and headers, shared by every
HTTP surface, so that no such value reaches ``int()``, a comparison or the database unchecked.

``str.isdigit()`` is not a check of a number: it accepts ``²`` (which ``int()`` refuses) and
``٣`` (which ``int()`` reads as 3), and says nothing of size (``int()`` refuses more than 4,300
digits; PostgreSQL refuses a bigint past 2^63 - 1). Here a number is ASCII digits only, of a
bounded length, so a bad one is the caller's 4xx, never a 500.
"""

from __future__ import annotations

import hmac
import re

from api_sender.jobs import decimal_id

#: ASCII digits only (``re``'s ``\d`` would take every Unicode digit).
_ASCII_DIGITS = re.compile(r"[0-9]+")
#: The queue.name CHECK of migrations/0001_queue.sql: a name that fails it cannot be a queue.
_QUEUE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,99}")
#: What an error says a job id is.
JOB_ID_RULE = "a job id is a positive integer of ASCII digits below 2^63"
QUEUE_NAME_RULE = (
    "a queue name is 1 to 100 of A-Z a-z 0-9 _ . : / -, starting with a letter or digit"
)


def is_ascii_digits(text: str) -> bool:
    """Whether ``text`` is one or more ASCII digits and nothing else."""
    return _ASCII_DIGITS.fullmatch(text) is not None


def ascii_int(text: str, *, max_digits: int) -> int | None:
    """The value of ``text`` when it is 1 to ``max_digits`` ASCII digits, else ``None``: no
    sign, no spaces, no underscores, no other script's digits."""
    if len(text) > max_digits or not is_ascii_digits(text):
        return None
    return int(text)


def job_id(text: str) -> int | None:
    """The job id ``text`` names (1 to 2^63 - 1 in ASCII digits), else ``None``: the same rule
    as every other surface's (:func:`api_sender.jobs.decimal_id`)."""
    return decimal_id(text)


def is_queue_name(text: str) -> bool:
    """Whether ``text`` passes the queue name rule (and so could name a queue at all)."""
    return _QUEUE_NAME.fullmatch(text) is not None


def same_secret(given: str | bytes, expected: str | bytes) -> bool:
    """Whether two secrets are equal, compared in constant time as bytes: text of any script
    (even a lone surrogate) is just unequal, never an error (``hmac.compare_digest`` raises
    ``TypeError`` on non-ASCII ``str``)."""
    return hmac.compare_digest(_octets(given), _octets(expected))


def _octets(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")
