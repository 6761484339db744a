"""What every /v1 request goes through: the bearer token, a bounded body, database errors.

``IngestAuth`` runs before routing, so an unknown /v1 path or a wrong method gets the same 403
or 401 as a known one and reveals nothing to a caller without the token.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import asyncpg
import structlog
from pydantic import SecretStr
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from api_sender import Sender

from ..db.connections import TRANSIENT_ERRORS
from ..state import ServiceState

log = structlog.get_logger("worker.ingest")

#: The largest request body /v1 reads (1 MiB); larger answers 413.
MAX_BODY_BYTES = 1 << 20
#: How long one request may wait on the database before it answers 503.
DATABASE_TIMEOUT_SECONDS = 10.0

T = TypeVar("T")


class HttpError(Exception):
    """A request the endpoint refuses: status, a short error and optional field-level details."""

    def __init__(self, status: int, error: str, **details: Any) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.details = details

    def response(self) -> JSONResponse:
        """The JSON answer: ``{"error": ..., **details}``."""
        return JSONResponse({"error": self.error, **self.details}, status_code=self.status)


class IngestAuth:
    """ASGI middleware: 403 ``ingest disabled`` without INGEST_TOKEN, 401 for a missing or
    wrong bearer token (compared in constant time), else the wrapped /v1 app."""

    def __init__(self, app: ASGIApp, token: SecretStr | None) -> None:
        self.app = app
        secret = token.get_secret_value() if token is not None else ""
        # An empty INGEST_TOKEN disables ingest rather than accepting an empty bearer.
        self._expected = secret.encode() if secret else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, error = refusal
        log.info("ingest.rejected", status=status, reason=error, path=scope.get("path"))
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        response = JSONResponse({"error": error}, status_code=status, headers=headers)
        await response(scope, receive, send)

    def _refusal(self, scope: Scope) -> tuple[int, str] | None:
        if self._expected is None:
            return 403, "ingest disabled"
        header = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                header = value
                break
        scheme, _, given = header.partition(b" ")
        if scheme.lower() != b"bearer" or not given.strip():
            return 401, "missing bearer token"
        if not hmac.compare_digest(given.strip(), self._expected):
            return 401, "invalid bearer token"
        return None


async def read_json(request: Request) -> Any:
    """The request's JSON body, at most :data:`MAX_BODY_BYTES`.

    The declared Content-Length is checked first, then the bytes actually read, so a chunked
    body or a lying header cannot push more than the limit into memory. NaN and Infinity are
    refused: JSON has no such values and the queue could not store them.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise HttpError(400, "invalid Content-Length")
        if int(declared) > MAX_BODY_BYTES:
            raise HttpError(413, "request body too large", limit_bytes=MAX_BODY_BYTES)
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > MAX_BODY_BYTES:
            raise HttpError(413, "request body too large", limit_bytes=MAX_BODY_BYTES)
    if not body:
        raise HttpError(400, "empty body: a JSON object is required")
    try:
        return json.loads(bytes(body), parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise HttpError(400, f"invalid JSON: {exc}") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


async def in_database(state: ServiceState, work: Callable[[Sender], Awaitable[T]]) -> T:
    """Run ``work`` with the process's sender; 503 when the database cannot be reached.

    Each write here is one statement, so a refused or failed one stores nothing. The one
    ambiguous case is a timeout while the commit is under way; a client that sends its own
    event ids can retry that safely, since the hub dedupes by id.
    """
    sender = state.sender
    if sender is None:
        raise HttpError(503, "database unreachable", reason=state.not_ready_reason or "starting")
    try:
        with anyio.fail_after(DATABASE_TIMEOUT_SECONDS):
            return await work(sender)
    except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError):
        raise HttpError(503, "schema not installed: a worker install creates it") from None
    except TRANSIENT_ERRORS as exc:
        log.warning("ingest.database_unreachable", error=f"{type(exc).__name__}: {exc}")
        raise HttpError(503, "database unreachable") from None
    except asyncpg.InsufficientPrivilegeError as exc:
        # A deployment fault, not the caller's: say so in JSON rather than a bare 500.
        log.error(
            "ingest.permission_denied",
            error=str(exc),
            hint="grant the api role its rights on the queue schema (config/roles.sql)",
        )
        raise HttpError(500, "the database refused the write: permission denied") from None
    except asyncpg.PostgresError as exc:
        log.error("ingest.database_error", error=f"{type(exc).__name__}: {exc}")
        raise HttpError(500, "database error; nothing was enqueued") from None
