"""A real billing hub on loopback for the usage tests: HTTP, Basic auth, switchable faults.

It runs Starlette on uvicorn in a thread of the test process, so the daemon under test (a
subprocess) posts to it over TCP exactly as it would to the real hub, and a test can switch it
to fail with 5xx, hang past the client's timeout, answer 401, refuse a poison event with 400,
hold future-dated events, and read back every event it accepted (and when).
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

Mode = Literal["ok", "fail", "hang", "unauthorized", "malformed"]


@dataclass
class Received:
    """One event the hub accepted: when, and what it said the event's time was."""

    id: str
    at: float
    occurred_at: datetime
    data: dict[str, Any]


@dataclass
class HubState:
    """Everything the hub saw and answered; read it under ``Hub.lock``."""

    accepted: dict[str, Received] = field(default_factory=dict)
    duplicates: Counter[str] = field(default_factory=Counter)
    held: Counter[str] = field(default_factory=Counter)
    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    batch_sizes: list[int] = field(default_factory=list)
    authorizations: set[str] = field(default_factory=set)
    content_types: set[str] = field(default_factory=set)


class Hub:
    """The hub server. ``mode`` picks its answer; the defaults answer like a healthy hub."""

    def __init__(self, client_id: str = "hub-client", client_secret: str = "hub-s3cret-value"):
        self.client_id = client_id
        self.client_secret = client_secret
        self.lock = threading.Lock()
        self.state = HubState()
        self.mode: Mode = "ok"
        #: The status of ``fail`` mode.
        self.fail_status = 503
        #: How long ``hang`` mode waits before answering 503 (past any client timeout).
        self.hang_seconds = 30.0
        #: Answer ``held`` for events whose occurred_at is after the hub's clock plus this.
        self.hold_future_after: float | None = 0.0
        #: Refuse (400) every batch holding one of these ids: a poison event.
        self.refuse_ids: set[str] = set()
        #: Seconds between recording a batch and answering it (a slow hub).
        self.answer_delay = 0.0
        #: Set each time a batch is recorded (a test waits on it to act "mid-batch").
        self.batch_arrived = threading.Event()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Where the daemon posts batches (HUB_URL)."""
        return f"http://127.0.0.1:{self.port}/v1/usage"

    def env(self) -> dict[str, str]:
        """The daemon settings that point USAGE_DOWNSTREAM=http at this hub."""
        return {
            "USAGE_DOWNSTREAM": "http",
            "HUB_URL": self.url,
            "HUB_CLIENT_ID": self.client_id,
            "HUB_CLIENT_SECRET": self.client_secret,
        }

    def set(self, **changes: Any) -> None:
        """Change the hub's behaviour (mode, refuse_ids, answer_delay, ...) at once."""
        with self.lock:
            for name, value in changes.items():
                if not hasattr(self, name):
                    raise AttributeError(name)
                setattr(self, name, value)

    def accepted_ids(self) -> set[str]:
        """Every event id accepted so far."""
        with self.lock:
            return set(self.state.accepted)

    def snapshot(self) -> HubState:
        """A copy of what the hub saw so far."""
        with self.lock:
            s = self.state
            return HubState(
                dict(s.accepted),
                Counter(s.duplicates),
                Counter(s.held),
                s.requests,
                Counter(s.statuses),
                list(s.batch_sizes),
                set(s.authorizations),
                set(s.content_types),
            )

    def wait_accepted(self, ids: set[str], timeout: float) -> None:
        """Block until every id in ``ids`` was accepted; fail naming how many are missing."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ids <= self.accepted_ids():
                return
            time.sleep(0.05)
        missing = ids - self.accepted_ids()
        raise AssertionError(f"{len(missing)} of {len(ids)} events never accepted by the hub")

    def start(self) -> Hub:
        """Serve in a background thread until :meth:`stop`."""
        app = Starlette(routes=[Route("/v1/usage", self._receive, methods=["POST"])])
        config = uvicorn.Config(
            app, log_config=None, access_log=False, lifespan="off", timeout_graceful_shutdown=1
        )
        self._server = uvicorn.Server(config)
        self._sock.listen(128)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("hub did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._sock.close()

    def _authorized(self, request: Request) -> bool:
        expected = base64.b64encode(f"{self.client_id}:{self.client_secret}".encode()).decode()
        header = request.headers.get("authorization", "")
        return header == f"Basic {expected}"

    async def _receive(self, request: Request) -> Response:
        body = await request.body()
        with self.lock:
            self.state.requests += 1
            self.state.authorizations.add(request.headers.get("authorization", ""))
            self.state.content_types.add(request.headers.get("content-type", ""))
            mode = self.mode
        if mode == "hang":
            await asyncio.sleep(self.hang_seconds)
            return self._answer(503, {"error": "hung"})
        if mode == "unauthorized" or not self._authorized(request):
            return self._answer(401, {"error": "unauthorized"})
        if mode == "fail":
            return self._answer(self.fail_status, {"error": "down"})
        if request.headers.get("content-type") != "application/json":
            return self._answer(415, {"error": "json only"})
        events = json.loads(body)["events"]
        if mode == "malformed":
            return self._answer(200, {"accepted": "everything"})
        answer = self._record(events)
        # Set once the batch is recorded: a test that kills the poster now kills it mid-batch,
        # after the hub took the events and before the poster read the answer.
        self.batch_arrived.set()
        if answer is None:
            return self._answer(400, {"error": "invalid event"})
        if self.answer_delay:
            await asyncio.sleep(self.answer_delay)
        return self._answer(200, answer)

    def _record(self, events: list[dict[str, Any]]) -> dict[str, Any] | None:
        now = time.time()
        with self.lock:
            if any(e["id"] in self.refuse_ids for e in events):
                return None
            self.state.batch_sizes.append(len(events))
            accepted, duplicate, held = [], [], []
            for event in events:
                occurred = datetime.fromisoformat(event["occurred_at"])
                limit = self.hold_future_after
                if limit is not None and occurred.timestamp() > now + limit:
                    held.append({"id": event["id"], "reason": "occurred_at_window"})
                    self.state.held[event["id"]] += 1
                elif event["id"] in self.state.accepted:
                    duplicate.append(event["id"])
                    self.state.duplicates[event["id"]] += 1
                else:
                    accepted.append(event["id"])
                    self.state.accepted[event["id"]] = Received(event["id"], now, occurred, event)
        return {"accepted": accepted, "duplicate": duplicate, "held": held}

    def _answer(self, status: int, body: dict[str, Any]) -> Response:
        with self.lock:
            self.state.statuses[status] += 1
        return JSONResponse(body, status_code=status)
