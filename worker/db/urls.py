"""DATABASE_URL: checked at boot the way asyncpg will read it, and shown without credentials.

A URL asyncpg cannot use at all (``notaurl``, an ``http://`` URL, port 99999) is invalid
configuration, refused at boot with exit 2, instead of a connect loop that retries it forever as
if the server were down. Multi-host URLs (``postgresql://u@h1:5432,h2:5432/db?
target_session_attrs=read-write``, contract section 12) pass: asyncpg tries the hosts in turn.
"""

from __future__ import annotations

from urllib.parse import parse_qs, unquote, urlsplit

SCHEMES = ("postgresql", "postgres")
#: The values asyncpg accepts for these two query parameters.
SSL_MODES = frozenset({"disable", "allow", "prefer", "require", "verify-ca", "verify-full"})
SESSION_ATTRS = frozenset(
    {"any", "primary", "standby", "read-write", "read-only", "prefer-standby"}
)


def check_database_url(url: str) -> None:
    """Raise ``ValueError`` (never quoting the URL: it may hold a password) unless asyncpg can
    connect with ``url``: the scheme, every host's port, and the query parameters it checks."""
    example = "e.g. postgresql://user:password@host:5432/dbname"
    if not url.strip():
        raise ValueError(f"is empty; unset it for the embedded server, or give a URL ({example})")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ValueError(f"is not a URL ({exc}); {example}") from None
    if parts.scheme not in SCHEMES:
        raise ValueError(f"must be a postgresql:// URL ({example})")
    hostspec = parts.netloc.rpartition("@")[2]
    for host in hostspec.split(",") if hostspec else []:
        _check_port(_port_of(unquote(host)))
    try:
        query = parse_qs(parts.query, strict_parsing=True) if parts.query else {}
    except ValueError:
        raise ValueError("has a malformed query string (expected name=value&...)") from None
    for port in query.get("port", [])[-1:]:
        for each in port.split(","):
            _check_port(each)
    for name, allowed in (("sslmode", SSL_MODES), ("target_session_attrs", SESSION_ATTRS)):
        for value in query.get(name, [])[-1:]:
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(sorted(allowed))}")


def target_session_attrs(url: str) -> str:
    """``url``'s ``target_session_attrs`` ('' when it has none)."""
    try:
        parts = urlsplit(url)
        query = parse_qs(parts.query) if parts.query else {}
    except ValueError:
        return ""
    return query.get("target_session_attrs", [""])[-1]


def session_left_behind(attrs: str, settings: object) -> bool:
    """Whether a connection opened for ``target_session_attrs`` ``attrs`` no longer has the
    server it asked for, from the parameters the server reports (asyncpg ``get_settings()``,
    no round trip): ``read-write`` and the session is read-only (a hot standby, or
    ``default_transaction_read_only`` on: a demoted primary); ``primary`` and it is a hot
    standby. Reconnecting then finds the host that is."""
    standby = getattr(settings, "in_hot_standby", "off") == "on"
    if attrs == "read-write":
        return standby or getattr(settings, "default_transaction_read_only", "off") == "on"
    if attrs == "primary":
        return standby
    return False


def _port_of(host: str) -> str:
    """The port part of ``host``, ``[v6]:port`` or ``name:port`` ('' when absent)."""
    if host.startswith("["):
        address, bracket, rest = host[1:].partition("]")
        if not bracket or not address:
            raise ValueError("has an unclosed [IPv6] host")
        return rest[1:] if rest.startswith(":") else rest
    return host.rpartition(":")[2] if ":" in host else ""


def _check_port(port: str) -> None:
    if port == "":
        return
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and 1 <= int(port) <= 65535):
        raise ValueError("has a port that is not a number from 1 to 65535")


def shown_hosts(url: str) -> str:
    """The ``host:port`` list of ``url`` for messages (no user, no password); '' if none."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return ""
    hostspec = unquote(parts.netloc.rpartition("@")[2])
    if not hostspec:
        hosts = parse_qs(parts.query).get("host", [""])[-1] if parts.query else ""
        return hosts
    return hostspec
