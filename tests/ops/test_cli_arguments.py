"""Every number the jobs commands take (cursor, ids, limit) is checked as ASCII digits within
range: anything else exits 2 with one line naming the argument, and changes nothing (issue 28
item 7)."""

from __future__ import annotations

import asyncpg
import pytest

from api_sender import InvalidArgument, Sender
from api_sender.jobs import ids_of, parse_cursor
from tests.support.processes import run_cli
from tests.support.queues import make_queue

pytestmark = pytest.mark.slow

#: Texts str.isdigit (or int) accepts that are not a plain decimal number, and numbers past
#: a bigint.
NOT_NUMBERS = ["²", "١٢", "1_000", " 12", "+5", "-3", "0", "9223372036854775808", "9" * 5000]
#: Those an id list took for another number, or failed on with int()'s own message.
NOT_IDS = ["²", "١٢", "9" * 5000]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        *((["jobs", "list", "--after", text], "--after") for text in NOT_NUMBERS),
        (["jobs", "list", "--after", "abc"], "--after"),
        *((["jobs", "list", "--limit", text], "--limit") for text in ["²", "0", "1001", "x"]),
        *((["jobs", "show", text], "job id") for text in NOT_NUMBERS),
        *((["jobs", "retry", "1", text], "job id") for text in NOT_IDS),
        (["jobs", "resume", "²"], "job id"),
    ],
)
async def test_a_bad_number_exits_2_with_one_line_and_changes_nothing(
    db_url: str, pool: asyncpg.Pool, sender: Sender, argv: list[str], named: str
) -> None:
    """A cursor, id or limit that is not ASCII digits in range exits 2 with one stderr line
    naming the argument (no traceback), prints nothing and writes no audit row."""
    await make_queue(pool, "q")
    [job_id] = await sender.send_many("q", [{}])
    await sender.jobs.cancel([job_id])
    await pool.execute("DELETE FROM public.audit_log")
    result = run_cli(db_url, *argv)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert named in lines[0], lines[0]
    assert len(lines[0]) < 300, lines[0]
    assert await pool.fetchval("SELECT count(*) FROM public.audit_log") == 0
    assert await pool.fetchval("SELECT state::text FROM jobs.job WHERE id = $1", job_id) == (
        "cancelled"
    )


async def test_good_numbers_still_work(db_url: str, pool: asyncpg.Pool, sender: Sender) -> None:
    """A plain cursor, id and limit are taken as before."""
    await make_queue(pool, "q")
    ids = await sender.send_many("q", [{}, {}, {}])
    listed = run_cli(db_url, "jobs", "list", "--limit", "2", "--after", str(ids[-1]))
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split()[7] == str(ids[1])
    assert run_cli(db_url, "jobs", "show", str(ids[0])).returncode == 0


@pytest.mark.parametrize("text", NOT_NUMBERS)
def test_the_library_refuses_the_same_texts_with_its_validation_error(text: str) -> None:
    """parse_cursor (shared with the HTTP admin API) and ids_of raise InvalidArgument, never
    a bare ValueError from int()."""
    with pytest.raises(InvalidArgument):
        parse_cursor(text)
    with pytest.raises(InvalidArgument):
        ids_of([text])
