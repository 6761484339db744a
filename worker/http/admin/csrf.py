"""CSRF protection of the console's forms: a signed token in every form, and the Origin check.

The browser sends Basic credentials with any request to the console, so a page on another site
could make it POST. Every action form carries a token only the console can make (an HMAC keyed
by a key derived from ADMIN_TOKEN, so every replica behind a load balancer accepts it, valid for
two hours), and a POST must come from the console's own origin or one in CONSOLE_ORIGINS.
"""

from __future__ import annotations

import hashlib
import hmac
import time

from starlette.requests import Request

from ..inputs import ascii_int, same_secret

#: How long a form's token stays valid (seconds).
TOKEN_LIFETIME = 2 * 3600
#: A stamp is Unix seconds: ten digits until the year 2286, twelve is plenty.
_MAX_STAMP_DIGITS = 12


class Csrf:
    """Issues and checks form tokens; checks the origin of a POST."""

    def __init__(self, admin_secret: bytes | None, extra_origins: frozenset[str]) -> None:
        # Without ADMIN_TOKEN nobody may act: no key, and every token is refused.
        self._key = (
            hashlib.sha256(b"chassis-worker console csrf\x00" + admin_secret).digest()
            if admin_secret
            else None
        )
        self._origins = extra_origins

    def token(self, now: float | None = None) -> str:
        """A fresh token for a form."""
        stamp = str(int(now if now is not None else time.time()))
        return f"{stamp}.{self._sign(stamp)}"

    def valid(self, token: str, now: float | None = None) -> bool:
        """Whether ``token`` was issued here within its lifetime. A token of any other shape
        (Unicode digits, non-ASCII text, a 5,000-digit stamp) is just not valid."""
        if self._key is None:
            return False
        stamp, _, signature = token.partition(".")
        issued = ascii_int(stamp, max_digits=_MAX_STAMP_DIGITS)
        if issued is None or not signature:
            return False
        age = (now if now is not None else time.time()) - issued
        if not 0 <= age <= TOKEN_LIFETIME:
            return False
        return same_secret(signature, self._sign(stamp))

    def same_origin(self, request: Request) -> bool:
        """Whether the POST's Origin (or, lacking one, its Referer) is the console's own origin
        or one of CONSOLE_ORIGINS."""
        origin = request.headers.get("origin")
        if origin is None or origin == "null":
            referer = request.headers.get("referer", "")
            origin = _origin_of(referer) if referer else None
        if not origin:
            return False
        origin = origin.rstrip("/").lower()
        own = f"{request.url.scheme}://{request.headers.get('host', '')}".lower()
        return origin == own or origin in self._origins

    def _sign(self, stamp: str) -> str:
        if self._key is None:
            raise RuntimeError("no CSRF key: ADMIN_TOKEN is not set")
        return hmac.new(self._key, stamp.encode(), hashlib.sha256).hexdigest()


def _origin_of(url: str) -> str | None:
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    return f"{scheme}://{rest.split('/', 1)[0]}"
