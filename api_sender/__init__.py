"""chassis-worker's producer side: enqueue jobs, emit usage events, schedule timers.

Importable without the worker; runs no DDL.
"""

from .errors import InvalidArgument, InvalidJob, PermissionDenied, QueueNotFound, SenderError
from .events import UsageEvent, new_ulid
from .jobs import Actor, Job, JobFilter, JobPage, JobsApi
from .options import SendOptions
from .pool import create_pool
from .queues import QueuesApi
from .sender import Sender
from .sync_sender import SyncSender
from .timers import Timers
from .usage import USAGE_HELD_QUEUE, USAGE_QUEUE, UsageRetry, UsageSink, usage_send_options

__all__ = [
    "USAGE_HELD_QUEUE",
    "USAGE_QUEUE",
    "Actor",
    "InvalidArgument",
    "InvalidJob",
    "Job",
    "JobFilter",
    "JobPage",
    "JobsApi",
    "PermissionDenied",
    "QueueNotFound",
    "QueuesApi",
    "SendOptions",
    "Sender",
    "SenderError",
    "SyncSender",
    "Timers",
    "UsageEvent",
    "UsageRetry",
    "UsageSink",
    "create_pool",
    "new_ulid",
    "usage_send_options",
]
