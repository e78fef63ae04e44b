"""The benchmark's database: a fresh scratch database, dropped afterwards.

Without `BOOMERANG_DATABASE_URL` the embedded cluster of `boomerang up` is started (or
joined) in the data folder; with it, the scratch database is made on that server (its
role must be allowed to CREATE DATABASE). Either way the benchmark never writes to an
existing database.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from boomerang_registry.inspection import BENCH_REARM_SQL, BENCH_SIZES_SQL, BENCH_VACUUM_SQL
from boomerang_server.config.settings import normalize_database_url

from boomerang_tools.stack.postgres import EmbeddedPostgres


def plain_dsn(url: str) -> str:
    """A libpq/asyncpg URL (no SQLAlchemy driver suffix)."""
    return normalize_database_url(url).replace("postgresql+asyncpg://", "postgresql://")


def with_database(url: str, name: str) -> str:
    """`url` pointing at database `name`."""
    parts = urlsplit(plain_dsn(url))
    return urlunsplit(parts._replace(path=f"/{name}"))


@dataclass
class BenchDatabase:
    """Where the benchmark's data lives and how to reach it."""

    configured_url: str
    data_dir: Path
    keep: bool = False
    url: str = ""
    name: str = ""
    embedded: EmbeddedPostgres | None = None
    notes: dict[str, str] = field(default_factory=dict)

    async def start(self) -> str:
        """Start or reach the server and create the scratch database; returns its URL."""
        if self.configured_url:
            server_url = plain_dsn(self.configured_url)
            self.notes["server"] = "configured (BOOMERANG_DATABASE_URL)"
        else:
            self.embedded = EmbeddedPostgres(self.data_dir.resolve())
            server_url = await asyncio.to_thread(self.embedded.start)
            self.notes["server"] = f"embedded, data in {self.embedded.data}"
        self.name = f"boomerang_bench_{uuid.uuid4().hex[:10]}"
        self.notes["name"] = self.name
        admin = await asyncpg.connect(with_database(server_url, "postgres"), timeout=10)
        try:
            await admin.execute(f'CREATE DATABASE "{self.name}"')
            self.notes["version"] = str(await admin.fetchval("SHOW server_version"))
            for setting in ("shared_buffers", "synchronous_commit", "max_connections"):
                self.notes[setting] = str(await admin.fetchval(f"SHOW {setting}"))
        finally:
            await admin.close()
        self.url = with_database(server_url, self.name)
        return self.url

    async def stop(self) -> None:
        """Drop the scratch database (unless kept) and stop an embedded server this run started."""
        try:
            if self.name and not self.keep:
                admin = await asyncpg.connect(with_database(self.url, "postgres"), timeout=10)
                try:
                    await admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
                finally:
                    await admin.close()
        finally:
            if self.embedded is not None:
                await asyncio.to_thread(self.embedded.stop)


async def sizes(conn: asyncpg.Connection) -> dict[str, float]:
    """Database, leases and audit sizes in MB, and the live lease count."""
    row = await conn.fetchrow(BENCH_SIZES_SQL)
    mb = 1024 * 1024
    return {
        "live_leases": int(row["live_leases"]),
        "db_size_mb": round(row["database_bytes"] / mb, 1),
        "leases_table_mb": round(row["leases_bytes"] / mb, 1),
        "lease_indexes_mb": round(row["lease_index_bytes"] / mb, 1),
        "lease_events_mb": round(row["events_bytes"] / mb, 1),
    }


async def rearm_claims(conn: asyncpg.Connection, tenant_prefix: str = "bench-t") -> int:
    """Give the benchmark's claimed leases back (CLAIMED → RETAINED) so the next step's plans
    PULL again, then vacuum; returns how many. A benchmark-only shortcut: in service the
    prefill node's report settles each claim."""
    status = await conn.execute(BENCH_REARM_SQL, tenant_prefix + "%")
    await conn.execute(BENCH_VACUUM_SQL)
    return int(status.split()[-1])
