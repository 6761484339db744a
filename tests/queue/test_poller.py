"""The poller in-process: per-job outcomes, expiry, batches, and a clean stop."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

import anyio
import asyncpg

from api_sender import Sender
from tests.support.queues import make_queue
from worker.queue.completer import Completer
from worker.queue.holdings import Holdings
from worker.queue.jobs import ClaimedJob
from worker.queue.maintenance import Maintenance
from worker.queue.poller import Consumer, Poller
from worker.queue.sql import render
from worker.queue.store import JobStore

SQL = render("jobs")


async def run_until(
    pool: asyncpg.Pool,
    consumer: Consumer,
    done: Callable[[], Awaitable[bool]],
    timeout: float = 10,
    *,
    beside: Callable[[], Awaitable[None]] | None = None,
    store_type: type[JobStore] = JobStore,
) -> None:
    """Run one poller (and its completer, and ``beside`` if given) until ``done()`` holds, then
    stop it cleanly. ``store_type``: a JobStore subclass wrapping the statements."""
    store = store_type(pool, SQL, uuid.uuid4())
    holdings = Holdings()
    completer = Completer(store, holdings)
    poller = Poller(consumer, store, completer, holdings)
    async with anyio.create_task_group() as tg:
        tg.start_soon(completer.run)
        tg.start_soon(poller.run)
        if beside is not None:
            tg.start_soon(beside)
        poller.waker.wake()
        with anyio.fail_after(timeout):
            while not await done():
                poller.waker.wake()
                await anyio.sleep(0.05)
        poller.stop()
        await poller.stopped.wait()
        await completer.drain()
        tg.cancel_scope.cancel()


async def states(pool: asyncpg.Pool) -> dict[int, tuple[str, str | None]]:
    """job id -> (state, error text)."""
    rows = await pool.fetch("SELECT id, state::text, output->>'error' AS e FROM jobs.job")
    return {r["id"]: (r["state"], r["e"]) for r in rows}


async def test_a_raising_handler_fails_only_its_own_job(pool, sender: Sender) -> None:
    """In one batch, the job whose handler raises fails; the others complete."""
    await make_queue(pool, "q", retry_limit=0)
    ids = await sender.send_many("q", [{"n": n} for n in range(5)])

    async def handler(job: ClaimedJob) -> None:
        if job.data["n"] == 2:
            raise ValueError("bad n")

    async def settled() -> bool:
        return all(s in ("completed", "failed") for s, _ in (await states(pool)).values())

    await run_until(pool, Consumer("q", batch_size=5, concurrency=2, run_job=handler), settled)
    result = await states(pool)
    assert result[ids[2]] == ("failed", "ValueError: bad n")
    assert [result[i][0] for i in ids if i != ids[2]] == ["completed"] * 4


async def test_a_handler_past_its_expiry_is_cancelled_and_fails(pool, sender: Sender) -> None:
    """A handler still running at expire_seconds is cancelled; the attempt fails as expired,
    and a TimeoutError the handler raises itself is reported as its own error."""
    await make_queue(pool, "q", retry_limit=0, expire_seconds=1)
    slow, own = await sender.send_many("q", [{"kind": "slow"}, {"kind": "own"}])
    cancelled: list[int] = []

    async def handler(job: ClaimedJob) -> None:
        if job.data["kind"] == "own":
            raise TimeoutError("upstream did not answer")
        try:
            await anyio.sleep(30)
        except anyio.get_cancelled_exc_class():
            cancelled.append(job.id)
            raise

    async def settled() -> bool:
        return all(s == "failed" for s, _ in (await states(pool)).values())

    await run_until(pool, Consumer("q", batch_size=2, concurrency=2, run_job=handler), settled)
    result = await states(pool)
    assert cancelled == [slow]
    assert result[slow] == ("failed", "expired: ran past 1s")
    assert result[own] == ("failed", "TimeoutError: upstream did not answer")


async def test_batch_outcomes_per_job_or_all_at_once(pool, sender: Sender) -> None:
    """A batch runner fails the ids it returns and completes the rest; raising fails all."""
    await make_queue(pool, "q", retry_limit=0)
    first = await sender.send_many("q", [{"n": n} for n in range(3)])
    calls = 0

    async def run_batch(jobs: list[ClaimedJob]) -> dict[int, str] | None:
        nonlocal calls
        calls += 1
        if calls == 1:
            return {jobs[0].id: "refused"}
        raise RuntimeError("downstream down")

    async def first_settled() -> bool:
        return all(s != "active" and s != "created" for s, _ in (await states(pool)).values())

    await run_until(pool, Consumer("q", batch_size=3, run_batch=run_batch), first_settled)
    result = await states(pool)
    assert result[first[0]] == ("failed", "refused")
    assert [result[i][0] for i in first[1:]] == ["completed", "completed"]
    second = await sender.send_many("q", [{"n": n} for n in range(2)])

    async def second_settled() -> bool:
        current = await states(pool)
        return all(current[i][0] == "failed" for i in second)

    await run_until(pool, Consumer("q", batch_size=3, run_batch=run_batch), second_settled)
    result = await states(pool)
    assert {result[i] for i in second} == {("failed", "RuntimeError: downstream down")}


async def waiting_in_hand(pool: asyncpg.Pool, running: set[int], finished: set[int]) -> set[int]:
    """Active jobs whose handler has neither started nor finished: claimed, waiting in the
    worker for a runner while their expiry clock (counted from the claim) runs."""
    rows = await pool.fetch("SELECT id FROM jobs.job WHERE state = 'active'")
    return {r["id"] for r in rows} - running - finished


def rescuing(pool: asyncpg.Pool) -> Callable[[], Awaitable[None]]:
    """Another replica's maintenance, rescuing expired claims every 0.25 s (stale limit 5 s)."""

    async def loop() -> None:
        maintenance = Maintenance(
            JobStore(pool, SQL, uuid.uuid4()), SQL, "jobs", interval=60, stale_seconds=5
        )
        while True:
            await maintenance.run_once(prune=False)
            await anyio.sleep(0.25)

    return loop


async def test_claimed_jobs_never_expire_waiting_for_a_runner(pool, sender: Sender) -> None:
    """Issue 10's case: batch_size 10, concurrency 1, expiry 3 s and a 1 s handler while
    expired claims are rescued: the worker holds no more jobs than it runs, so all 10 complete
    on their first attempt, each run once, none rescued."""
    await make_queue(pool, "q", retry_limit=2, expire_seconds=3)
    ids = await sender.send_many("q", [{"n": n} for n in range(10)])
    runs: Counter[int] = Counter()
    finished: set[int] = set()
    waiting: set[int] = set()

    async def handler(job: ClaimedJob) -> None:
        runs[job.id] += 1
        waiting.update(await waiting_in_hand(pool, {job.id}, finished))
        await anyio.sleep(1)
        finished.add(job.id)

    async def settled() -> bool:
        return all(s in ("completed", "failed") for s, _ in (await states(pool)).values())

    await run_until(
        pool,
        Consumer("q", batch_size=10, concurrency=1, run_job=handler),
        settled,
        timeout=30,
        beside=rescuing(pool),
    )
    result = await states(pool)
    assert {result[i] for i in ids} == {("completed", None)}
    assert runs == Counter({i: 1 for i in ids})
    attempts = await pool.fetch("SELECT attempt, retry_count FROM jobs.job")
    assert {(r["attempt"], r["retry_count"]) for r in attempts} == {(1, 0)}
    assert waiting == set()


async def test_a_batch_consumer_claims_only_for_a_free_runner(pool, sender: Sender) -> None:
    """Jobs arriving one by one while a batch consumer's only runner is busy are not claimed
    as batches of their own to wait in the worker: the next claim, made when the runner is
    free, takes them together."""
    await make_queue(pool, "q", retry_limit=0, expire_seconds=30)
    running: set[int] = set()
    finished: set[int] = set()
    waiting: set[int] = set()
    batches: list[list[int]] = []
    first_started = anyio.Event()

    async def run_batch(jobs: list[ClaimedJob]) -> None:
        mine = {job.id for job in jobs}
        batches.append(sorted(mine))
        running.update(mine)
        waiting.update(await waiting_in_hand(pool, running, finished))
        first_started.set()
        await anyio.sleep(0.6)
        running.difference_update(mine)
        finished.update(mine)

    ids: list[int] = []

    async def send_one_by_one() -> None:
        ids.extend(await sender.send_many("q", [{"n": 0}]))
        await first_started.wait()
        for n in range(1, 4):
            ids.extend(await sender.send_many("q", [{"n": n}]))
            await anyio.sleep(0.1)

    async def settled() -> bool:
        current = await states(pool)
        return len(current) == 4 and all(s == "completed" for s, _ in current.values())

    await run_until(
        pool,
        Consumer("q", batch_size=5, concurrency=1, run_batch=run_batch),
        settled,
        beside=send_one_by_one,
    )
    assert waiting == set()
    assert batches == [[ids[0]], sorted(ids[1:])]


async def test_an_unencodable_error_text_sinks_no_other_outcome(pool, sender: Sender) -> None:
    """A handler error with a lone surrogate and a NUL, failing beside jobs that fail and
    succeed: every outcome is written, and the error is stored with both replaced."""
    await make_queue(pool, "q", retry_limit=0)
    ids = await sender.send_many("q", [{"n": n} for n in range(6)])

    async def handler(job: ClaimedJob) -> None:
        n = job.data["n"]
        if n == 0:
            raise ValueError("bad \ud800 byte\x00 here")
        if n in (1, 2):
            raise ValueError(f"plain {n}")

    async def settled() -> bool:
        return all(s in ("completed", "failed") for s, _ in (await states(pool)).values())

    await run_until(pool, Consumer("q", batch_size=6, concurrency=6, run_job=handler), settled)
    result = await states(pool)
    assert result[ids[0]] == ("failed", "ValueError: bad \ufffd byte here")
    assert [result[i] for i in ids[1:3]] == [
        ("failed", "ValueError: plain 1"),
        ("failed", "ValueError: plain 2"),
    ]
    assert [result[i] for i in ids[3:]] == [("completed", None)] * 3


async def test_a_refused_completion_riding_a_claim_stops_neither_poller_nor_others(
    pool, sender: Sender, captured_logs
) -> None:
    """When the database refuses one job's completion that rides on the next claim, the poller
    keeps claiming and every other job completes; the refused job alone is given up."""
    await make_queue(pool, "q", retry_limit=0)
    ids = await sender.send_many("q", [{"n": n} for n in range(8)])
    refused = ids[2]
    await pool.execute(
        "CREATE FUNCTION public.refuse_outcome() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN RAISE EXCEPTION 'refused by the test' USING ERRCODE = '23514'; END $$;"
        " CREATE TRIGGER refuse_outcome BEFORE UPDATE ON jobs.job FOR EACH ROW"
        f" WHEN (OLD.id = {int(refused)} AND NEW.state <> 'active')"
        " EXECUTE FUNCTION public.refuse_outcome()"
    )

    async def handler(job: ClaimedJob) -> None:
        await anyio.sleep(0.01)

    async def settled() -> bool:
        current = await states(pool)
        return all(current[i][0] == "completed" for i in ids if i != refused)

    await run_until(pool, Consumer("q", batch_size=2, concurrency=2, run_job=handler), settled)
    assert (await states(pool))[refused][0] == "active"
    given_up = [e["ids"] for e in captured_logs if e["event"] == "job.outcome_given_up"]
    assert given_up == [[refused]]


async def test_two_claims_in_flight_never_hold_more_than_concurrency(pool, sender: Sender) -> None:
    """A consumer two batches wide (batch 5, concurrency 10) claims with two fetchers, each
    reserving its slots before its claim is sent: however the claims interleave, no more than
    10 jobs are ever active, and all 60 run once."""
    await make_queue(pool, "q", retry_limit=0, expire_seconds=30)
    ids = await sender.send_many("q", [{"n": n} for n in range(60)])
    most = 0
    runs: Counter[int] = Counter()

    async def handler(job: ClaimedJob) -> None:
        nonlocal most
        runs[job.id] += 1
        active = await pool.fetchval("SELECT count(*) FROM jobs.job WHERE state = 'active'")
        most = max(most, active)
        await anyio.sleep(0.02)

    async def settled() -> bool:
        return all(s == "completed" for s, _ in (await states(pool)).values())

    consumer = Consumer("q", batch_size=5, concurrency=10, run_job=handler)
    await run_until(pool, consumer, settled, timeout=60)
    assert runs == Counter({i: 1 for i in ids})
    assert 0 < most <= 10


async def test_a_claim_in_flight_lends_the_slots_of_the_successes_it_carries(
    pool, sender: Sender
) -> None:
    """Batch 5, concurrency 10, two fetchers. The first batch's successes ride a claim, held in
    flight here; meanwhile the second batch finishes. Its fetcher sends a claim of its own that
    carries those successes, while the first is still in flight: the first claim's commit
    completes 5 jobs as it claims 5, so its carried slots count as free. (Counting them as taken
    until that commit, the second fetcher found no room, the completer wrote its successes
    alone, and its next claim waited for both statements: in a drain, a third statement per two
    batches and half the time with one statement in flight.) At most 10 jobs are ever active."""
    await make_queue(pool, "q", retry_limit=0, expire_seconds=30)
    ids = await sender.send_many("q", [{"n": n} for n in range(40)])
    carrying = anyio.Event()  # the first claim carrying a whole batch is in flight
    overlapped = anyio.Event()  # a second claim carrying successes started meanwhile
    in_flight = 0
    started = 0
    most = 0
    runs: Counter[int] = Counter()

    class HeldStore(JobStore):
        async def complete_and_claim(
            self, done: Sequence[ClaimedJob], queue: str, limit: int, *, lazy: bool = False
        ) -> tuple[list[ClaimedJob], set[int]]:
            nonlocal in_flight
            in_flight += 1
            try:
                if in_flight > 1:
                    overlapped.set()
                elif not carrying.is_set() and len(done) == limit == 5:
                    carrying.set()
                    with anyio.move_on_after(5):
                        await overlapped.wait()
                return await super().complete_and_claim(done, queue, limit, lazy=lazy)
            finally:
                in_flight -= 1

    async def handler(job: ClaimedJob) -> None:
        nonlocal started
        runs[job.id] += 1
        started += 1
        if 5 < started <= 10:  # the second batch finishes once the first one's claim is out
            with anyio.fail_after(10):
                await carrying.wait()

    async def settled() -> bool:
        return all(s == "completed" for s, _ in (await states(pool)).values())

    async def count_active() -> None:
        nonlocal most
        while True:
            active = await pool.fetchval("SELECT count(*) FROM jobs.job WHERE state = 'active'")
            most = max(most, active)
            await anyio.sleep(0.002)

    consumer = Consumer("q", batch_size=5, concurrency=10, run_job=handler)
    await run_until(pool, consumer, settled, timeout=60, beside=count_active, store_type=HeldStore)
    assert carrying.is_set()
    assert overlapped.is_set()
    assert runs == Counter({i: 1 for i in ids})
    assert 0 < most <= 10


async def test_runners_start_as_work_needs_them_up_to_concurrency(pool, sender: Sender) -> None:
    """Concurrency 50 is a ceiling, not 50 tasks parked from the start: handlers that never
    await leave the poller a handful of runner tasks, while handlers that wait on each other
    make it start runners until exactly ``concurrency`` run at once, and never more."""
    await make_queue(pool, "q", retry_limit=0, expire_seconds=30)
    await sender.send_many("q", [{"n": n} for n in range(40)])
    most_tasks = 0

    async def quick(job: ClaimedJob) -> None:
        pass

    async def quick_settled() -> bool:
        nonlocal most_tasks
        most_tasks = max(most_tasks, len(asyncio.all_tasks()))
        return all(s == "completed" for s, _ in (await states(pool)).values())

    quick_consumer = Consumer("q", batch_size=10, concurrency=50, run_job=quick)
    await run_until(pool, quick_consumer, quick_settled)
    assert most_tasks < 20  # the test's own, the completer, two fetchers, a few runners

    await pool.execute("DELETE FROM jobs.job")
    await sender.send_many("q", [{"n": n} for n in range(20)])
    running = 0
    most_running = 0
    all_in = anyio.Event()

    async def waiting(job: ClaimedJob) -> None:
        nonlocal running, most_running
        running += 1
        most_running = max(most_running, running)
        if running == 8:
            all_in.set()
        with anyio.fail_after(10):
            await all_in.wait()
        await anyio.sleep(0.01)
        running -= 1

    async def settled() -> bool:
        return all(s == "completed" for s, _ in (await states(pool)).values())

    await run_until(pool, Consumer("q", batch_size=4, concurrency=8, run_job=waiting), settled)
    assert all_in.is_set()
    assert most_running == 8


async def test_a_claim_whose_answer_never_came_hands_back_what_it_took(
    pool, sender: Sender, captured_logs
) -> None:
    """Batch 5, concurrency 10, two fetchers. The second claim commits but its answer never
    comes (the store raises as asyncpg does when the connection dies under a statement): its 5
    jobs are active under this live worker, which no rescue takes them from, so before this
    they waited out their 900 s expiry. Once no claim is in flight the poller hands back exactly
    those, while the first claim's jobs still run: every job runs once, the lost ones on their
    second claim, within the test's 30 s."""
    await make_queue(pool, "q", retry_limit=0, expire_seconds=900)
    ids = await sender.send_many("q", [{"n": n} for n in range(20)])
    lost: list[int] = []
    handed_back = anyio.Event()
    calls = 0

    class UnansweredStore(JobStore):
        async def _lose(self, jobs: list[ClaimedJob]) -> None:
            nonlocal calls
            calls += 1
            if calls == 2 and jobs:
                lost.extend(job.id for job in jobs)
                raise asyncpg.ConnectionDoesNotExistError("connection was closed in the middle")

        async def claim(
            self, queue: str, limit: int, *, one_per_key: bool = False
        ) -> list[ClaimedJob]:
            jobs = await super().claim(queue, limit, one_per_key=one_per_key)
            await self._lose(jobs)
            return jobs

        async def complete_and_claim(
            self, done: Sequence[ClaimedJob], queue: str, limit: int, *, lazy: bool = False
        ) -> tuple[list[ClaimedJob], set[int]]:
            jobs, gone = await super().complete_and_claim(done, queue, limit, lazy=lazy)
            await self._lose(jobs)
            return jobs, gone

        async def hand_back_unanswered(
            self, queue: str, since: bytes | None, kept: Sequence[bytes]
        ) -> list[int]:
            back = await super().hand_back_unanswered(queue, since, kept)
            if back:
                handed_back.set()
            return back

    runs: Counter[int] = Counter()
    first: set[int] = set()

    async def handler(job: ClaimedJob) -> None:
        runs[job.id] += 1
        if len(first) < 5 and job.id not in lost:
            first.add(job.id)
        if job.id in first:  # the first claim's jobs are held through the hand-back
            with anyio.fail_after(20):
                await handed_back.wait()

    async def settled() -> bool:
        return all(s == "completed" for s, _ in (await states(pool)).values())

    consumer = Consumer("q", batch_size=5, concurrency=10, run_job=handler)
    await run_until(pool, consumer, settled, timeout=30, store_type=UnansweredStore)
    assert len(lost) == 5
    assert runs == Counter({i: 1 for i in ids})
    attempts = dict(await pool.fetch("SELECT id, attempt FROM jobs.job"))
    assert {i for i in ids if attempts[i] == 2} == set(lost)
    back = [e for e in captured_logs if e["event"] == "poller.unanswered_claim_handed_back"]
    assert [(e["jobs"], sorted(e["job_ids"])) for e in back] == [(5, sorted(lost))]
