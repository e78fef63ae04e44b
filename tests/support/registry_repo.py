"""The registry's repository as the service opens it: the owner engine and the tenant pool."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from boomerang_registry.rawsql import TenantPool
from boomerang_registry.repository import RegistryRepository
from boomerang_registry.statements import WARM_UP
from boomerang_server.db.engine import make_engine


@asynccontextmanager
async def open_repository(
    database_url: str, size: int = 4, ttl_margin_seconds: float = 10.0
) -> AsyncIterator[RegistryRepository]:
    """A repository on `size` owner connections and `size` tenant-pool connections (as the
    row-level-security role, warmed up as the service's are); closed on exit."""
    owner = make_engine(database_url, pool_size=size)
    pool = await TenantPool.open(database_url, size, "boomerang_service", warm=WARM_UP)
    try:
        yield RegistryRepository(owner, pool, ttl_margin_seconds)
    finally:
        await pool.close()
        await owner.dispose()
