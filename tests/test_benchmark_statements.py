"""The SQL-only ceiling of ``make bench`` builds its pgbench scripts from the worker's own
statement pieces: a change to a claim's columns or a fence's types must keep them running, and
every batch they claim must still match its fence. A small run of each variant, on the bare
table and on the real one (pgbench is PostgreSQL's own, which the test server's packages bring).
"""

from __future__ import annotations

import pytest

from benchmarks import ceiling


@pytest.mark.parametrize("table", ["bare", "real"])
@pytest.mark.parametrize("variant", ["one", "two"])
async def test_the_ceiling_scripts_complete_every_batch_they_claim(
    variant: str, table: str
) -> None:
    # ceiling_once raises unless every claimed batch was completed through the fence.
    result = await ceiling.ceiling_once(variant, table, clients=1, jobs=200, batch=20)
    assert result.rate > 0
    # The server runs here: its CPU is counted (a few ticks at most for 200 jobs).
    assert result.server_us_per_job is not None
