"""What every /v1 request goes through: the bearer token, database errors, a client that left.

``IngestAuth`` runs before routing, so an unknown /v1 path or a wrong method gets the same 403
or 401 as a known one and reveals nothing to a caller without the token. The body is read by
:mod:`.body`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import asyncpg
import structlog
from pydantic import SecretStr, ValidationError
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from api_sender import InvalidJob, Sender
from api_sender.storable import segment

from ..db.connections import TRANSIENT_ERRORS
from ..state import ServiceState
from .inputs import same_secret

log = structlog.get_logger("worker.ingest")

#: How long one request may wait on the database before it answers 503.
DATABASE_TIMEOUT_SECONDS = 10.0
#: The key in an ASGI scope's ``state`` that says the listener (:mod:`.protocol`) refused the
#: request's body and answered it: the app's read then ends as if the client had left.
REFUSED_STATE_KEY = "http_refused"

T = TypeVar("T")


class HttpError(Exception):
    """A request the endpoint refuses: status, a short error and optional field-level details."""

    def __init__(
        self, status: int, error: str, *, headers: dict[str, str] | None = None, **details: Any
    ) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.headers = headers
        self.details = details

    def response(self) -> JSONResponse:
        """The JSON answer: ``{"error": ..., **details}``."""
        return JSONResponse(
            {"error": self.error, **self.details}, status_code=self.status, headers=self.headers
        )


def field_errors(
    exc: ValidationError, whole: str, index: int | None = None
) -> list[dict[str, Any]]:
    """A pydantic error as ``{"field", "message"}`` items; field names come from the caller's
    keys, so each step is escaped and shortened (:func:`segment`) before it is echoed."""
    errors: list[dict[str, Any]] = []
    for problem in exc.errors():
        field = ".".join(segment(part) for part in problem["loc"]) or whole
        message = str(problem["msg"]).removeprefix("Value error, ")[:300]
        error: dict[str, Any] = {"field": field, "message": message}
        if index is not None:
            error["index"] = index
        errors.append(error)
    return errors


class ClientGone:
    """ASGI middleware: a client that hangs up before its body is read is one log line
    (``http.client_disconnected``), not a traceback; there is nobody left to answer. A body the
    listener itself refused mid-read (:mod:`.protocol`) ends the same way, already logged."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        except ClientDisconnect:
            if (scope.get("state") or {}).get(REFUSED_STATE_KEY):
                # The listener refused this body and answered it (logged http.refused): the
                # read ended there, not because the client left.
                return
            log.info(
                "http.client_disconnected",
                method=scope.get("method"),
                path=scope.get("path"),
                client=(scope.get("client") or [None])[0],
            )


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
        if not same_secret(given.strip(), self._expected):
            return 401, "invalid bearer token"
        return None


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
    except InvalidJob as exc:
        # The producer's own check (NUL, surrogates, ranges), before any write: the caller's.
        field = exc.field or "(body)"
        raise HttpError(
            400, "invalid request", errors=[{"field": field, "message": str(exc)[:300]}]
        ) from None
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
