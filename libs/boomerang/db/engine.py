"""The async SQLAlchemy engine every service uses (asyncpg underneath)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from boomerang.config.settings import sqlalchemy_database_url


def make_engine(
    url: str, pool_size: int = 10, application_name: str = "boomerang", role: str = ""
) -> AsyncEngine:
    """An engine with a warm-able pool, short connect timeout and READ COMMITTED.

    With `role`, every connection runs as that Postgres role (row-level security applies).
    """
    server_settings = {"application_name": application_name}
    if role:
        server_settings["role"] = role
    return create_async_engine(
        sqlalchemy_database_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        pool_timeout=5,
        connect_args={
            "timeout": 5,
            "command_timeout": 10,
            "server_settings": server_settings,
        },
    )


async def warm_pool(engine: AsyncEngine, connections: int) -> None:
    """Open `connections` pooled connections now so the first calls do not pay for them."""
    held = []
    try:
        for _ in range(connections):
            held.append(await engine.connect())
    finally:
        for conn in held:
            await conn.close()
