"""A migrated database of one's own on the tests' Postgres, for a session or a module.

The session's shared database keeps every lease and engine other tests left behind; a
module whose services act on the whole database (a reaper, a stack that discovers engines
through the registry) must not see them, so it makes its own and drops it afterwards.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg
from boomerang_server.db import upgrade

from tests.support.admin_db import DEFAULT_ADMIN_URL


def admin_url() -> str:
    """The superuser URL the tests use (tests/conftest.py sets it when it chose a private cluster)."""
    url = os.environ.get("BOOMERANG_TEST_ADMIN_URL", DEFAULT_ADMIN_URL)
    return url.replace("postgresql+asyncpg://", "postgresql://")


async def execute(url: str, sql: str) -> None:
    """Run one statement on its own connection."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def fetch_value(url: str, sql: str) -> str:
    """The first column of the first row of one query, as text, on its own connection."""
    conn = await asyncpg.connect(url, timeout=10)
    try:
        return str(await conn.fetchval(sql))
    finally:
        await conn.close()


@contextmanager
def fresh_database(prefix: str = "boomerang_db") -> Iterator[str]:
    """A new database named `prefix` and a random suffix, migrated; dropped when the block ends."""
    admin = admin_url()
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    asyncio.run(execute(admin, f'CREATE DATABASE "{name}"'))
    try:
        url = f"{admin.rsplit('/', 1)[0]}/{name}"
        upgrade(url)
        yield url
    finally:
        asyncio.run(execute(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
