"""How a job family plugs into the daemon: its queue, its schedule and its consumer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from api_sender import Sender

from ..db.bounded import HandlerPool
from ..declarations import QueueOptions
from ..queue.poller import Consumer
from ..settings import Settings


@dataclass(frozen=True, slots=True)
class JobContext:
    """What a job family's consumer may use at run time."""

    settings: Settings
    #: The daemon's pool. Handlers borrow connections from it; the poller bounds how many
    #: handlers run at once so the claim and completion statements always find one.
    pool: HandlerPool
    #: For handlers that enqueue (the usage re-drive, window holds).
    sender: Sender
    #: Where a handler opens a dedicated connection for a session lock (the purge run lock):
    #: the server itself, never a transaction pooler.
    session_url: str


@dataclass(frozen=True, slots=True)
class InstalledJob:
    """A queue the install creates, the schedule it sets, and the consumer that runs it."""

    queue: str
    options: QueueOptions
    #: The cron to set; ``None`` removes any schedule of the queue (the queue itself stays).
    cron: str | None
    make_consumer: Callable[[JobContext], Consumer]
