"""Alembic environment: async engine, and an advisory lock so concurrent starts migrate once."""

from __future__ import annotations

import asyncio
import logging

from alembic import context
from boomerang_server.db.models import metadata
from sqlalchemy import pool, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

MIGRATION_LOCK = 0x626F6F6D  # "boom"
logging.getLogger("alembic").setLevel(logging.WARNING)


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata, transaction_per_migration=True)
    connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK})
    try:
        with context.begin_transaction():
            context.run_migrations()
    finally:
        connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK})
        connection.commit()


async def _main() -> None:
    engine = create_async_engine(context.config.get_main_option("sqlalchemy.url") or "", poolclass=pool.NullPool)
    async with engine.connect() as connection:
        await connection.run_sync(_run)
    await engine.dispose()


asyncio.run(_main())
