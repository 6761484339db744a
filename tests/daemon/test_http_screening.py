"""The shared checks of untrusted HTTP text (worker/http/inputs.py) and the chunk-size budget
of the listener (worker/http/protocol.py), in process: no server, no database."""

from __future__ import annotations

import pytest

from worker.http.inputs import ascii_int, is_queue_name, job_id, same_secret
from worker.http.protocol import ChunkBudget

LIMIT = 1 << 20


@pytest.mark.parametrize(
    "text", ["\u00b2", "\u0663", "\uff11", "1_0", " 1", "1 ", "+1", "-1", "1.0", "", "9" * 10_000]
)
def test_ascii_int_refuses_anything_but_a_bounded_run_of_ascii_digits(text: str) -> None:
    """Unicode digits (which str.isdigit accepts), signs, spaces, underscores and a 10,000-digit
    number are not numbers here: None, never an exception."""
    assert ascii_int(text, max_digits=20) is None


def test_job_ids_are_positive_bigints() -> None:
    """A job id is 1 to 2^63 - 1 in ASCII digits; 0, 2^63 and Unicode digits are not one."""
    assert job_id("42") == 42
    assert job_id(str(2**63 - 1)) == 2**63 - 1
    for text in ("0", str(2**63), "\u0663", "9" * 30):
        assert job_id(text) is None, text


def test_queue_names_follow_the_name_check() -> None:
    """The rule of queue.name's CHECK: a slash inside is fine; a NUL, a leading dash or 101
    characters are not."""
    assert is_queue_name("team/reports")
    assert is_queue_name("a.b:c-d_e")
    for name in ("", "-x", "/x", "a\x00b", "q" * 101, "caf\u00e9"):
        assert not is_queue_name(name), name


@pytest.mark.parametrize("given", ["\u00b2", "caf\u00e9", "\ud800", "x" * 5000, b"\xff"])
def test_secrets_of_any_text_compare_unequal_without_an_error(given: str | bytes) -> None:
    """Non-ASCII text, a lone surrogate or raw bytes is just a different secret."""
    assert same_secret(given, "the-secret") is False
    assert same_secret("the-secret", "the-secret") is True


@pytest.mark.parametrize(
    "parts",
    [
        [b"100001\r\n"],
        [f"{2**80:x}\r\n".encode()],
        [b"1000", b"00000000"],
        [b"80000\r\n" + b"x" * 0x80000 + b"\r\n80001\r\n"],
        [b"80000;ext=1\r\n", b"x" * 0x80000, b"\r", b"\n80001"],
    ],
    ids=["one-past", "2^80", "digits-split", "sum-past", "sum-past-split"],
)
def test_a_body_announced_past_the_limit_is_known_at_its_size_line(parts: list[bytes]) -> None:
    """A chunk size past the limit, or sizes adding up past it, count as over as soon as the
    size's digits say so, even split across reads and before its line ends."""
    budget = ChunkBudget(LIMIT)
    assert any(budget.over(part) for part in parts)


@pytest.mark.parametrize(
    "parts",
    [
        [b"100000\r\n" + b"x" * LIMIT + b"\r\n0\r\n\r\n"],
        [b"5\r\nhello\r\n", b"A;x=y\r\n0123456789\r\n", b"0\r\n\r\n"],
        [b"5\r\nhelloXX"],
        [b"zz\r\n"],
    ],
    ids=["exactly-the-limit", "split-with-extensions", "malformed-footer", "no-size"],
)
def test_bodies_within_the_limit_or_malformed_are_left_to_h11(parts: list[bytes]) -> None:
    """A body of at most the limit is never over; malformed framing is not followed further
    (h11 refuses it) rather than guessed at."""
    budget = ChunkBudget(LIMIT)
    assert not any(budget.over(part) for part in parts)
