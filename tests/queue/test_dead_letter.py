"""Dead letters: every exhausted job leaves its copy; the install refuses a dead letter that
would drop copies, whoever declared it."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from api_sender import Sender
from tests.support.queues import make_queue
from worker.jobs.chassis import CHASSIS_QUEUES
from worker.jobs.registry import installed_jobs
from worker.queue.sql import render
from worker.queue.store import JobStore
from worker.settings import ConfigError, Settings

SQL = render("jobs")


async def exhaust(pool: asyncpg.Pool, sender: Sender, queue: str, n: int) -> None:
    """Send ``n`` jobs to ``queue`` (retry limit 0) and fail them all: half in one statement,
    the rest one by one."""
    await sender.send_many(queue, [{"n": i} for i in range(n)])
    store = JobStore(pool, SQL, uuid.uuid4())
    jobs = await store.claim(queue, n)
    assert len(jobs) == n
    half = n // 2
    outcomes = await store.fail([(job, "boom") for job in jobs[:half]])
    for job in jobs[half:]:
        outcomes += await store.fail([(job, "boom")])
    assert [o.state for o in outcomes] == ["failed"] * n


@pytest.mark.parametrize("policy", ["standard", "short", "singleton", "stately"])
async def test_every_exhausted_job_leaves_its_copy(
    pool: asyncpg.Pool, sender: Sender, policy: str
) -> None:
    """Ten exhausted jobs leave ten copies in their dead letter, whatever its policy, even a
    short or stately one the install would refuse (set here behind its back, as an older
    version or a hand-written UPDATE could)."""
    await make_queue(pool, "dead")
    await make_queue(pool, "src", retry_limit=0, dead_letter="dead")
    await pool.execute("UPDATE jobs.queue SET policy = $1 WHERE name = 'dead'", policy)
    await exhaust(pool, sender, "src", 10)
    copies = await pool.fetch(
        "SELECT data->>'n' AS n, state::text FROM jobs.job WHERE queue = 'dead' ORDER BY id"
    )
    assert sorted(int(c["n"]) for c in copies) == list(range(10))
    assert {c["state"] for c in copies} == {"created"}


async def test_the_copies_run_one_at_a_time_on_a_singleton_dead_letter(
    pool: asyncpg.Pool, sender: Sender
) -> None:
    """A singleton dead letter keeps every copy and runs them one at a time (they share the
    empty key)."""
    await make_queue(pool, "dead", policy="singleton")
    await make_queue(pool, "src", retry_limit=0, dead_letter="dead")
    await exhaust(pool, sender, "src", 4)
    store = JobStore(pool, SQL, uuid.uuid4())
    assert len(await store.claim("dead", 10, one_per_key=True)) == 1
    assert await store.claim("dead", 10, one_per_key=True) == []


@pytest.mark.parametrize("policy", ["short", "stately"])
async def test_a_dead_letter_already_installed_as_short_is_refused(
    pool: asyncpg.Pool, policy: str
) -> None:
    """Pointing a queue at a dead letter that another deployment installed as short or stately
    is refused, naming both, and the queue is not installed."""
    await make_queue(pool, "dead", policy=policy)
    with pytest.raises(ConfigError, match=f"'src' has dead letter 'dead' of policy '{policy}'"):
        await make_queue(pool, "src", dead_letter="dead")
    assert await pool.fetchval("SELECT count(*) FROM jobs.queue WHERE name = 'src'") == 0


@pytest.mark.parametrize("policy", ["short", "stately"])
async def test_turning_a_dead_letter_short_later_is_refused(
    pool: asyncpg.Pool, policy: str
) -> None:
    """Changing a queue to short or stately while another queue names it as its dead letter is
    refused, and the queue keeps its policy."""
    await make_queue(pool, "dead")
    await make_queue(pool, "src", dead_letter="dead")
    with pytest.raises(ConfigError, match="'src' has dead letter 'dead'"):
        await make_queue(pool, "dead", policy=policy)
    assert await pool.fetchval("SELECT policy FROM jobs.queue WHERE name = 'dead'") == "standard"


async def test_a_dead_letter_not_installed_is_refused_by_name(pool: asyncpg.Pool) -> None:
    """A dead letter that is not installed (not yet declared) is refused with a message naming
    it, not a foreign-key error."""
    with pytest.raises(ConfigError, match="'src' has dead letter 'later', which is not installed"):
        await make_queue(pool, "src", dead_letter="later")


def test_the_chassis_queues_are_what_the_registry_installs() -> None:
    """The names a tool may not redeclare are exactly the queues the chassis installs."""
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert tuple(job.queue for job in installed_jobs(settings, [])) == CHASSIS_QUEUES
