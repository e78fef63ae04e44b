"""The benchmark's database: a fresh scratch database, dropped afterwards.

Without `BOOMERANG_DATABASE_URL` the embedded cluster of `boomerang up` is started (or
joined) in the data folder; with it, the scratch database is made on that server (its
role must be allowed to CREATE DATABASE). Either way the benchmark never writes to an
existing database.

The SQL here is a test fixture's, not a service's: it loads, ages and measures the
registry's tables straight in the scratch database, as the integration tests do
(tests/unit/test_table_owners.py names this module a harness). No service runs it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from boomerang_server.config import normalize_database_url

from boomerang_tools.stack.postgres import EmbeddedPostgres

# The columns a RegisterRetainedBlocks writes (statements.REGISTER_BATCH_SQL), in the order
# the benchmark's preload builds its COPY records; and the REGISTERED event it appends.
PRELOAD_LEASE_COLUMNS = (
    "lease_id", "tenant", "conversation_id", "model", "engine_id", "engine_generation",
    "remote_request_id", "block_ids", "num_blocks", "num_tokens", "block_size", "chain",
    "tail_hash", "remote_host", "remote_port", "tp_size", "dcp_size", "pp_size", "state",
    "version", "finished_at", "created_at", "expires_at", "updated_at", "prompt_tokens", "prompt_key",
    "prompt_tail",
)
PRELOAD_EVENT_COLUMNS = (
    "created_at", "lease_id", "tenant", "conversation_id", "from_state", "to_state", "reason",
    "actor", "request_id",
)

BENCH_SIZES_SQL = """
SELECT pg_database_size(current_database()) AS database_bytes,
       pg_total_relation_size('leases') AS leases_bytes,
       pg_indexes_size('leases') AS lease_index_bytes,
       (SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0)::bigint FROM pg_inherits
        WHERE inhparent = 'lease_events'::regclass) AS events_bytes,
       (SELECT count(*) FROM leases WHERE state IN ('RETAINED', 'CLAIMED')) AS live_leases
"""
# A benchmark-only shortcut (in service the prefill node's report settles each claim).
BENCH_REARM_SQL = (
    "UPDATE leases SET state = 'RETAINED', claim_id = NULL, version = version + 1, updated_at = now() "
    "WHERE state = 'CLAIMED' AND tenant LIKE $1"
)
BENCH_VACUUM_SQL = "VACUUM (ANALYZE) leases"
BENCH_LIVE_BY_TENANT_SQL = "SELECT count(*) FROM leases WHERE tenant LIKE $1 AND state IN ('RETAINED', 'CLAIMED')"
BENCH_EXPIRY_LAGS_SQL = (
    "SELECT (details->>'lag_seconds')::float8 FROM lease_events WHERE reason = 'TTL_EXPIRED' AND tenant LIKE $1"
)
BENCH_EXPIRED_EARLY_SQL = (
    "SELECT count(*) FROM lease_events WHERE reason = 'TTL_EXPIRED' AND tenant LIKE $1 "
    "AND (details->>'lag_seconds')::float8 < 0"
)


async def copy_registrations(
    conn: asyncpg.Connection, leases: Sequence[tuple[object, ...]], events: Sequence[tuple[object, ...]]
) -> None:
    """COPY live leases and their REGISTERED events in one transaction (the tables' triggers,
    the deadline NOTIFY included, run as for a registration)."""
    async with conn.transaction():
        await conn.copy_records_to_table("leases", records=leases, columns=PRELOAD_LEASE_COLUMNS)
        await conn.copy_records_to_table("lease_events", records=events, columns=PRELOAD_EVENT_COLUMNS)


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
