"""The benchmark's database: a fresh scratch database, dropped afterwards.

Without `BOOMERANG_DATABASE_URL` the embedded cluster of `boomerang up` is started (or
joined) in the data folder; with it, the scratch database is made on that server (its
role must be allowed to CREATE DATABASE). Either way the benchmark never writes to an
existing database.

The SQL here is a test fixture's, not a service's: it loads, ages and measures the
registry's tables straight in the scratch database, as the integration tests do
(tests/unit/test_table_owners.py names this module a harness). No service runs it.

The preload COPYs live leases shaped as registrations write them: each lease row carries
what the registry's `REGISTER_BATCH_SQL` would have written for a RegisterRetainedBlocks of
that conversation on its decode engine (the engine's model, generation, side channel and
layout; block ids per KV-cache group; the token chain; the deadline on the engine's TTL less
the registry's margin), and each gets its REGISTERED row in `lease_events`, as the real
registration appends. The tables' triggers run (the deadline NOTIFY included).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from boomerang_server.config import asyncpg_dsn

from boomerang_tools.bench.workload import BLOCK_SIZE, Conversation, chain_for, prompt_end
from boomerang_tools.stack.postgres import EmbeddedPostgres

CHUNK = 10_000
Rows = list[tuple[object, ...]]

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


@dataclass(frozen=True)
class EngineRow:
    """A registered decode engine, as its leases copy it."""

    engine_id: str
    model: str
    generation: int
    host: str
    port: int
    ttl_seconds: int


def block_ids(c: Conversation) -> list[list[int]]:
    """The block-id groups a lease of `c` holds (one KV-cache group)."""
    start = (c.index * 131) % 1_000_000
    return [list(range(start, start + c.num_blocks))]


def lease_records(
    convs: Iterable[Conversation],
    engines: list[EngineRow],
    margin_seconds: float,
    spread: tuple[float, float, int] | None = None,
) -> tuple[Rows, Rows]:
    """Lease rows and their REGISTERED event rows for `convs`, in the order of
    `PRELOAD_LEASE_COLUMNS` and `PRELOAD_EVENT_COLUMNS`. With `spread` (start, window, count)
    the deadlines spread evenly over [start, start + window) in `count` slots."""
    now = datetime.now(UTC)
    leases: Rows = []
    events: Rows = []
    for c in convs:
        e = engines[c.engine]
        chain = chain_for(c)
        lease_id = uuid.uuid4()
        if spread is not None:
            start, window, count = spread
            slot = (c.index * 7919) % count
            expires = datetime.fromtimestamp(start + window * slot / count, UTC)
            finished = expires - timedelta(seconds=e.ttl_seconds - margin_seconds)
        else:
            finished = now - timedelta(milliseconds=c.index % 5000)
            expires = finished + timedelta(seconds=e.ttl_seconds - margin_seconds)
        leases.append((
            lease_id, c.tenant, c.conversation_id, e.model, e.engine_id, e.generation,
            f"chatcmpl-{lease_id.hex[:24]}", json.dumps(block_ids(c), separators=(",", ":")),
            c.num_blocks, c.num_tokens, BLOCK_SIZE, chain.block_hashes, chain.tail_hash, e.host,
            e.port, 1, 1, 1, "RETAINED", 1,
            finished, now, expires, now, *prompt_end(c, chain),
        ))
        events.append((now, lease_id, c.tenant, c.conversation_id, None, "RETAINED", "REGISTERED", "registry",
                       f"bench-{lease_id.hex[:16]}"))
    return leases, events


async def copy_leases(
    conn: asyncpg.Connection,
    convs: list[Conversation],
    engines: list[EngineRow],
    margin_seconds: float,
    progress: Callable[[int], None],
    spread: tuple[float, float, int] | None = None,
) -> float:
    """COPY `convs` as live leases and their REGISTERED events (chunks of 10k, one
    transaction each; the tables' triggers, the deadline NOTIFY included, run as for a
    registration); returns seconds.

    A helper process builds the next chunks while the server loads one, so building
    (Python) and loading (the server) overlap.
    """
    started = time.perf_counter()
    chunks = [convs[i : i + CHUNK] for i in range(0, len(convs), CHUNK)]
    loop = asyncio.get_running_loop()
    # Spawned, not forked: the parent has gRPC threads, which a fork must not copy.
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:

        def build(chunk: list[Conversation]) -> asyncio.Future[tuple[Rows, Rows]]:
            return loop.run_in_executor(pool, lease_records, chunk, engines, margin_seconds, spread)

        ahead = [build(chunk) for chunk in chunks[:2]]
        for i, chunk in enumerate(chunks):
            leases, events = await ahead[i]
            if i + 2 < len(chunks):
                ahead.append(build(chunks[i + 2]))
            async with conn.transaction():
                await conn.copy_records_to_table("leases", records=leases, columns=PRELOAD_LEASE_COLUMNS)
                await conn.copy_records_to_table("lease_events", records=events, columns=PRELOAD_EVENT_COLUMNS)
            progress(len(chunk))
    return time.perf_counter() - started


def with_database(url: str, name: str) -> str:
    """`url` pointing at database `name`."""
    parts = urlsplit(asyncpg_dsn(url))
    return urlunsplit(parts._replace(path=f"/{name}"))


@dataclass
class BenchDatabase:
    """Where the benchmark's data lives and how to reach it."""

    configured_url: str
    data_dir: Path
    url: str = ""
    name: str = ""
    embedded: EmbeddedPostgres | None = None
    notes: dict[str, str] = field(default_factory=dict)

    async def start(self) -> str:
        """Start or reach the server and create the scratch database; returns its URL."""
        if self.configured_url:
            server_url = asyncpg_dsn(self.configured_url)
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
        """Drop the scratch database and stop an embedded server this run started."""
        try:
            if self.name:
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


async def rearm_claims(conn: asyncpg.Connection) -> None:
    """Give the benchmark's claimed leases back (CLAIMED → RETAINED) so the next step's plans
    PULL again, then vacuum. A benchmark-only shortcut: in service the prefill node's report
    settles each claim.

    The step's last claims may still be being given back (the router's claim keeper, in
    registry transactions that lock several leases): this one UPDATE locks rows in scan order
    and can deadlock with one of them. Postgres then aborts one side; when it is this one, it
    runs again once the other has committed."""
    for attempt in range(5):
        try:
            await conn.execute(BENCH_REARM_SQL, "bench-t%")
            break
        except asyncpg.DeadlockDetectedError:
            if attempt == 4:
                raise
            await asyncio.sleep(0.1)
    await conn.execute(BENCH_VACUUM_SQL)
