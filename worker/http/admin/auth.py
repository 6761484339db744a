"""Who may use the admin API and the console, decided once per request before routing.

Two optional tokens: ``ADMIN_TOKEN`` reads and acts (principal ``admin``), ``CONSOLE_VIEW_TOKEN``
only reads (principal ``viewer``). With neither set both surfaces answer 403 ``admin disabled``.
The API takes them as a bearer token, the console as the password of HTTP Basic authentication
(any user name). Tokens are compared in constant time; the ingest token never matches.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Literal

from pydantic import SecretStr
from starlette.types import Scope

from ..inputs import same_secret

Principal = Literal["admin", "viewer"]
Scheme = Literal["bearer", "basic"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused: the status, the error text and the challenge to send."""

    status: int
    error: str
    challenge: str | None = None


class Tokens:
    """The two admin tokens of this process (empty ones count as unset)."""

    def __init__(self, admin: SecretStr | None, viewer: SecretStr | None) -> None:
        self._admin = _bytes(admin)
        self._viewer = _bytes(viewer)

    @property
    def enabled(self) -> bool:
        """Whether any admin surface is open at all."""
        return self._admin is not None or self._viewer is not None

    @property
    def admin_secret(self) -> bytes | None:
        """The admin token's bytes (the CSRF key is derived from it), if set."""
        return self._admin

    def principal(self, given: bytes) -> Principal | None:
        """Which principal ``given`` authenticates, comparing against both in constant time."""
        is_admin = self._admin is not None and same_secret(given, self._admin)
        is_viewer = self._viewer is not None and same_secret(given, self._viewer)
        if is_admin:
            return "admin"
        if is_viewer:
            return "viewer"
        return None

    def authenticate(self, scope: Scope, scheme: Scheme) -> Principal | Refusal:
        """The request's principal, or why it is refused (403 disabled, 401 unknown, 403 a
        viewer sending anything but GET/HEAD)."""
        challenge = 'Basic realm="chassis-worker console"' if scheme == "basic" else "Bearer"
        if not self.enabled:
            return Refusal(403, "admin disabled")
        given = _credential(scope, scheme)
        if given is None:
            return Refusal(401, "authentication required", challenge)
        principal = self.principal(given)
        if principal is None:
            return Refusal(401, "invalid token", challenge)
        if principal == "viewer" and scope.get("method") not in ("GET", "HEAD"):
            return Refusal(403, "the view token is read-only: actions need ADMIN_TOKEN")
        return principal


def _bytes(token: SecretStr | None) -> bytes | None:
    value = token.get_secret_value() if token is not None else ""
    return value.encode() if value else None


def _credential(scope: Scope, scheme: Scheme) -> bytes | None:
    header = b""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            header = value
            break
    kind, _, rest = header.partition(b" ")
    rest = rest.strip()
    if not rest:
        return None
    if scheme == "bearer":
        return rest if kind.lower() == b"bearer" else None
    if kind.lower() != b"basic":
        return None
    try:
        decoded = base64.b64decode(rest, validate=True)
    except (binascii.Error, ValueError):
        return None
    _user, sep, password = decoded.partition(b":")
    return password if sep and password else None
