"""The Python stacks a producer sends from, each as a pair of transactions on one client.

Every stack below opens its own client on the test database, sends one job inside a
transaction it rolls back and one inside a transaction it commits, and returns both ids
(``send`` returns the id before the commit decides). Sync stacks run in a thread.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from api_sender import Sender, SyncSender
from tests.support.tools import unavailable

QUEUE = "tool-work"

#: (rolled-back id, committed id)
Sent = tuple[int, int]


def need(module: str, extra: str) -> ModuleType:
    """Import ``module``; missing, skip (fail under CI) with the install hint."""
    try:
        return importlib.import_module(module)
    except ImportError:
        unavailable(f"{module} is not installed: pip install -e '.[{extra}]'")


def _ids(rolled: int | None, committed: int | None) -> Sent:
    assert rolled is not None
    assert committed is not None
    return rolled, committed


def _data(stack: str, outcome: str) -> dict[str, Any]:
    return {"stack": stack, "outcome": outcome}


async def asyncpg_stack(url: str) -> Sent:
    async with Sender.connect(url, max_size=1) as sender:
        conn = await asyncpg.connect(url)
        try:
            tx = conn.transaction()
            await tx.start()
            rolled = await sender.send(QUEUE, _data("asyncpg", "rolled"), connection=conn)
            await tx.rollback()
            async with conn.transaction():
                committed = await sender.send(QUEUE, _data("asyncpg", "kept"), connection=conn)
        finally:
            await conn.close()
    return _ids(rolled, committed)


async def psycopg_async_stack(url: str) -> Sent:
    psycopg = need("psycopg", "psycopg")
    async with (
        Sender.connect(url, max_size=1) as sender,
        await psycopg.AsyncConnection.connect(url) as conn,
    ):
        rolled = await sender.send(QUEUE, _data("psycopg-async", "rolled"), connection=conn)
        await conn.rollback()
        kept = await sender.send(QUEUE, _data("psycopg-async", "kept"), connection=conn)
        await conn.commit()
    return _ids(rolled, kept)


def psycopg_sync_stack(url: str) -> Sent:
    psycopg = need("psycopg", "psycopg")
    with SyncSender.connect(url) as sender, psycopg.connect(url) as conn:
        rolled = sender.send(QUEUE, _data("psycopg", "rolled"), connection=conn)
        conn.rollback()
        with conn.transaction():
            kept = sender.send(QUEUE, _data("psycopg", "kept"), connection=conn)
    return _ids(rolled, kept)


def _sqlalchemy_url(url: str, driver: str) -> str:
    return url.replace("postgresql://", f"postgresql+{driver}://", 1)


def sqlalchemy_core_stack(url: str) -> Sent:
    sqlalchemy = need("sqlalchemy", "sqlalchemy")
    engine = sqlalchemy.create_engine(_sqlalchemy_url(url, "psycopg"))
    try:
        with SyncSender.connect(url) as sender:
            with engine.connect() as conn:
                # The transaction begins lazily, at the send.
                rolled = sender.send(QUEUE, _data("sqlalchemy", "rolled"), connection=conn)
                conn.rollback()
            with engine.begin() as conn:
                kept = sender.send(QUEUE, _data("sqlalchemy", "kept"), connection=conn)
    finally:
        engine.dispose()
    return _ids(rolled, kept)


def sqlalchemy_session_stack(url: str) -> Sent:
    sqlalchemy = need("sqlalchemy", "sqlalchemy")
    orm = need("sqlalchemy.orm", "sqlalchemy")
    engine = sqlalchemy.create_engine(_sqlalchemy_url(url, "psycopg"))
    try:
        with SyncSender.connect(url) as sender:
            with orm.Session(engine) as session:
                rolled = sender.send(QUEUE, _data("session", "rolled"), connection=session)
                session.rollback()
            with orm.Session(engine) as session, session.begin():
                kept = sender.send(QUEUE, _data("session", "kept"), connection=session)
    finally:
        engine.dispose()
    return _ids(rolled, kept)


async def sqlalchemy_async_stack(url: str) -> Sent:
    """SQLAlchemy Core's AsyncConnection on its asyncpg dialect."""
    need("sqlalchemy", "sqlalchemy")
    aio = need("sqlalchemy.ext.asyncio", "sqlalchemy")
    engine = aio.create_async_engine(_sqlalchemy_url(url, "asyncpg"))
    try:
        async with Sender.connect(url, max_size=1) as sender:
            async with engine.connect() as conn:
                rolled = await sender.send(QUEUE, _data("sa-async", "rolled"), connection=conn)
                await conn.rollback()
            async with engine.begin() as conn:
                kept = await sender.send(QUEUE, _data("sa-async", "kept"), connection=conn)
    finally:
        await engine.dispose()
    return _ids(rolled, kept)


async def sqlalchemy_async_session_stack(url: str) -> Sent:
    """SQLAlchemy's AsyncSession on its psycopg (async) dialect."""
    need("sqlalchemy", "sqlalchemy")
    aio = need("sqlalchemy.ext.asyncio", "sqlalchemy")
    engine = aio.create_async_engine(_sqlalchemy_url(url, "psycopg"))
    try:
        async with Sender.connect(url, max_size=1) as sender:
            async with aio.AsyncSession(engine) as session:
                rolled = await sender.send(QUEUE, _data("sa-session", "rolled"), connection=session)
                await session.rollback()
            async with aio.AsyncSession(engine) as session, session.begin():
                kept = await sender.send(QUEUE, _data("sa-session", "kept"), connection=session)
    finally:
        await engine.dispose()
    return _ids(rolled, kept)


def configure_django(url: str) -> Any:
    """Django configured in this process (once) on the test database; its ``connection``."""
    need("django", "test")
    import django
    from django.conf import settings
    from django.db import connections

    parts = urlsplit(url)
    database = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/"),
        "USER": parts.username or "",
        "PASSWORD": parts.password or "",
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or 5432),
    }
    if not settings.configured:
        settings.configure(DATABASES={"default": database}, INSTALLED_APPS=[], USE_TZ=True)
        django.setup()
    else:
        connections["default"].close()
        connections["default"].settings_dict.update(database)
    return connections["default"]


def django_stack(url: str) -> Sent:
    configure_django(url)
    from django.db import connection, transaction

    try:
        with SyncSender.connect(url) as sender:
            with transaction.atomic():
                rolled = sender.send(QUEUE, _data("django", "rolled"), connection=connection)
                transaction.set_rollback(True)
            with transaction.atomic():
                kept = sender.send(QUEUE, _data("django", "kept"), connection=connection)
    finally:
        connection.close()
    return _ids(rolled, kept)


#: Every stack, by name: an async function of the database URL, or a sync one (run in a thread).
STACKS: dict[str, Callable[[str], Awaitable[Sent]] | Callable[[str], Sent]] = {
    "asyncpg": asyncpg_stack,
    "psycopg-async": psycopg_async_stack,
    "psycopg-sync": psycopg_sync_stack,
    "sqlalchemy-core-sync": sqlalchemy_core_stack,
    "sqlalchemy-core-async": sqlalchemy_async_stack,
    "sqlalchemy-orm-session": sqlalchemy_session_stack,
    "sqlalchemy-async-session": sqlalchemy_async_session_stack,
    "django-atomic": django_stack,
}
