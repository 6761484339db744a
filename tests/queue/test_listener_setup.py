"""The listener's (re)connect in-process: a database error on its set-up is retried with backoff,
never the end of the worker, and readiness names it meanwhile (issue 28, item 6)."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import anyio
import asyncpg
import pytest

from api_sender import Sender
from api_sender.schema import cancel_channel
from tests.queue.test_poller import SQL
from worker.boot import _serve_worker
from worker.jobs.registry import installed_jobs
from worker.queue import dispatcher as dispatcher_module
from worker.queue.dispatcher import Dispatcher
from worker.queue.waker import Waker
from worker.runtime import WorkerRuntime
from worker.settings import Settings
from worker.signals import StopRequest
from worker.state import ServiceState

REFUSED = 3


class _CancelledListen:
    """A real listener connection on which the server cancels the set-up (statement_timeout), as
    on a database whose every new session has statement_timeout = 1ms."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn

    def add_termination_listener(self, callback: Callable[[Any], None]) -> None:
        self._conn.add_termination_listener(callback)

    async def add_listener(self, channel: str, callback: Callable[..., None]) -> None:
        # The server's own QueryCanceledError, not one made up here.
        await self._conn.execute("SET statement_timeout = 1")
        await self._conn.execute("SELECT pg_sleep(1)")

    def is_closed(self) -> bool:
        return self._conn.is_closed()

    def terminate(self) -> None:
        self._conn.terminate()


async def test_a_listen_the_server_cancels_is_retried_and_readiness_says_why(
    db_url: str, monkeypatch: pytest.MonkeyPatch, captured_logs: list[dict[str, object]]
) -> None:
    """The server cancels the listener's LISTEN on its first three connects: the listener logs
    listener.failed with the error and the delay each time and retries, readiness reports
    "listener not connected" with the error meanwhile; the fourth connect listens, readiness
    clears, and a NOTIFY reaches its handler."""
    real_connect = dispatcher_module.connect
    tries = 0

    async def connect(url: str, **kwargs: Any) -> Any:
        nonlocal tries
        tries += 1
        conn = await real_connect(url, **kwargs)
        return _CancelledListen(conn) if tries <= REFUSED else conn

    monkeypatch.setattr(dispatcher_module, "connect", connect)
    heard: list[str] = []
    got = anyio.Event()

    def on_cancel(payload: str) -> None:
        heard.append(payload)
        got.set()

    listener = Dispatcher(
        db_url,
        "jobs",
        SQL,
        {"q": Waker()},
        poll_interval=0.5,
        stale_seconds=5,
        on_rescue_due=lambda: None,
        on_prune_due=lambda: None,
        min_retention_seconds=3600,
        extra_channels={cancel_channel("jobs"): on_cancel},
    )
    # WorkerRuntime.check reads only these two of the runtime.
    runtime = cast(WorkerRuntime, SimpleNamespace(dispatcher=listener, _polls=False))
    reasons: set[str | None] = set()
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.run)
        with anyio.fail_after(20):
            while not listener.first_listen.is_set():
                if tries >= 2:
                    reasons.add(WorkerRuntime.check(runtime))
                await anyio.sleep(0.01)
        assert WorkerRuntime.check(runtime) is None
        conn = await asyncpg.connect(db_url)
        try:
            await conn.execute("SELECT pg_notify($1, 'hello')", cancel_channel("jobs"))
        finally:
            await conn.close()
        with anyio.fail_after(5):
            await got.wait()
        tg.cancel_scope.cancel()
    assert tries == REFUSED + 1
    assert reasons == {
        "listener not connected: QueryCanceledError: canceling statement due to statement timeout"
    }
    failed = [e for e in captured_logs if e["event"] == "listener.failed"]
    assert len(failed) == REFUSED
    assert all(str(e["error"]).startswith("QueryCanceledError") for e in failed)
    assert all(isinstance(e["retry_in"], float) for e in failed)
    assert heard == ["hello"]
    assert listener.problem is None


async def test_a_worker_whose_listener_never_connects_stays_up_not_ready_and_stops_on_request(
    db_url: str, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker whose listener set-up the server refuses every time: its start neither ends
    nor gives up, it stays not ready with the listener's error as the reason, starts no
    handler, and a stop request ends it at once."""
    real_connect = dispatcher_module.connect

    async def connect(url: str, **kwargs: Any) -> Any:
        return _CancelledListen(await real_connect(url, **kwargs))

    monkeypatch.setattr(dispatcher_module, "connect", connect)
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        database_url=db_url,
        service_role="worker",
        poll_interval_seconds=0.5,
        database_pool_size=4,
    )
    state = ServiceState(settings)
    stop = StopRequest()
    sender = Sender(pool)
    jobs = installed_jobs(settings, [])
    reasons: set[str | None] = set()
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_serve_worker, settings, db_url, pool, sender, state, jobs, stop)
            # Past several backoffs (0.1 s to 5 s each, jittered).
            for _ in range(40):
                await anyio.sleep(0.1)
                reasons.add(await state.readiness())
            stopped_at = anyio.current_time()
            stop.request("test")
        assert anyio.current_time() - stopped_at < 3
    assert reasons == {
        "listener not connected: QueryCanceledError: canceling statement due to statement timeout"
    }
    assert await pool.fetchval("SELECT count(*) FROM jobs.job WHERE state = 'active'") == 0
