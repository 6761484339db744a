"""The chassis's own queues: every worker install creates them, and no tool may redeclare one.

A tool declaring one of these would replace its options (the usage queue would lose its dead
letter, a purge its singleton policy) and run a second consumer beside the chassis's own.
"""

from __future__ import annotations

from api_sender import USAGE_HELD_QUEUE, USAGE_QUEUE

from .purges import (
    APIKEY_EXPIRY_QUEUE,
    AUDIT_PURGE_QUEUE,
    IDEMPOTENCY_PURGE_QUEUE,
    ORPHAN_USER_PURGE_QUEUE,
)

#: In install order (worker/jobs/registry.py; a test pins that the two agree).
CHASSIS_QUEUES: tuple[str, ...] = (
    USAGE_HELD_QUEUE,
    USAGE_QUEUE,
    AUDIT_PURGE_QUEUE,
    APIKEY_EXPIRY_QUEUE,
    IDEMPOTENCY_PURGE_QUEUE,
    ORPHAN_USER_PURGE_QUEUE,
)
