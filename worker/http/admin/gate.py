"""ASGI middleware in front of /v1/admin and /console: authenticate, then record the principal."""

from __future__ import annotations

import structlog
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from .auth import Refusal, Scheme, Tokens

log = structlog.get_logger("worker.admin")


class AdminGate:
    """Refuses unauthenticated or unauthorised requests before routing (an unknown path gets
    the same answer as a known one); otherwise sets ``request.state.principal``."""

    def __init__(self, app: ASGIApp, tokens: Tokens, scheme: Scheme) -> None:
        self.app = app
        self.tokens = tokens
        self.scheme = scheme

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        outcome = self.tokens.authenticate(scope, self.scheme)
        if isinstance(outcome, Refusal):
            log.info(
                "admin.refused", status=outcome.status, reason=outcome.error, path=scope.get("path")
            )
            await self._refusal(outcome)(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = outcome
        await self.app(scope, receive, send)

    def _refusal(self, refusal: Refusal) -> Response:
        headers = {"WWW-Authenticate": refusal.challenge} if refusal.challenge else None
        if self.scheme == "basic":
            return PlainTextResponse(refusal.error, status_code=refusal.status, headers=headers)
        return JSONResponse({"error": refusal.error}, status_code=refusal.status, headers=headers)
