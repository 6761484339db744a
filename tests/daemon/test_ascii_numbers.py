"""Numbers typed by people outside HTTP: a DATABASE_URL's ports and the held commands' job ids
are ASCII digits of a bounded size, never another script's digits that int() would read."""

from __future__ import annotations

import pytest

from worker.db.urls import check_database_url
from worker.jobs.usage.operator import Selection


@pytest.mark.parametrize("port", ["\u0663\u0663", "\u00b2", "5432\u0663", "0", "65536", "9" * 5000])
def test_a_database_url_port_that_is_not_ascii_digits_from_1_to_65535_is_refused(
    port: str,
) -> None:
    """``postgresql://h:٣٣/db`` (Arabic-Indic digits, which int() reads as 33) is refused as
    a configuration error like any other port that is not a number from 1 to 65535."""
    with pytest.raises(ValueError, match="port"):
        check_database_url(f"postgresql://db:{port}/app")


def test_a_database_url_with_an_ascii_port_is_accepted() -> None:
    """The check still takes an ordinary port."""
    check_database_url("postgresql://db:5432/app")


@pytest.mark.parametrize(
    "token", ["job:\u0663", "job:\u00b2", "job:0", f"job:{2**63}", "job:" + "9" * 5000]
)
def test_a_held_job_id_that_is_not_a_bigint_in_ascii_digits_is_refused(token: str) -> None:
    """``held redrive job:٣`` named job 3 before; now it, a zero, a number past bigint and a
    5,000-digit one are each a ValueError naming the token (exit 2 on the CLI)."""
    with pytest.raises(ValueError, match="job:<id>"):
        Selection.of([token])


def test_held_job_ids_and_event_ids_still_parse() -> None:
    """ULIDs (any case) and job:<id> tokens give the selection they always gave."""
    chosen = Selection.of(["job:42", "01ARZ3NDEKTSV4RRFFQ69G5FAV".lower()])
    assert chosen.job_ids == (42,)
    assert chosen.event_ids == ("01ARZ3NDEKTSV4RRFFQ69G5FAV",)
