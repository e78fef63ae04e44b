"""Engines: registration, heartbeat, invalidation and listing.

Registering a newer generation and invalidating an engine end leases of every tenant, so
they run as the owner (repository.py); the heartbeat, every few seconds per engine, is one
autocommit statement on the hot-path pool. Each lease state change appends its
`lease_events` row in the same statement (TRANSITION_SQL).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, NamedTuple

from boomerang.errors import failed_precondition, not_found
from boomerang_server.leases import LeaseState
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from boomerang_registry.claim_store import Row, TenantPool
from boomerang_registry.statements import (
    ENGINE_COLUMNS,
    HEARTBEAT_SQL,
    LIVE_LEASE_FILTER,
    RETAINED_SQL,
    TRANSITION_SQL,
)
from boomerang_registry.wire import EngineSpec

REGISTER_ENGINE_SQL = """
INSERT INTO engines (engine_id, role, model, side_channel_host, side_channel_port,
    http_base_url, generation, kv_blocks_ttl_seconds, block_size, tp_size,
    dcp_size, pp_size, bytes_per_block, kv_recompute_threshold, status)
VALUES (:engine_id, :role, :model, :side_channel_host, :side_channel_port,
    :http_base_url, :generation, :kv_blocks_ttl_seconds, :block_size, :tp_size,
    :dcp_size, :pp_size, :bytes_per_block, :kv_recompute_threshold, 'ACTIVE')
ON CONFLICT (engine_id) DO UPDATE SET
    role = EXCLUDED.role, model = EXCLUDED.model,
    side_channel_host = EXCLUDED.side_channel_host,
    side_channel_port = EXCLUDED.side_channel_port,
    http_base_url = EXCLUDED.http_base_url,
    kv_blocks_ttl_seconds = EXCLUDED.kv_blocks_ttl_seconds,
    block_size = EXCLUDED.block_size, tp_size = EXCLUDED.tp_size,
    dcp_size = EXCLUDED.dcp_size, pp_size = EXCLUDED.pp_size,
    bytes_per_block = EXCLUDED.bytes_per_block,
    kv_recompute_threshold = EXCLUDED.kv_recompute_threshold,
    status = 'ACTIVE', heartbeat_at = now(),
    registered_at = CASE WHEN engines.generation < EXCLUDED.generation
                         THEN now() ELSE engines.registered_at END,
    generation = EXCLUDED.generation
"""


class Released(NamedTuple):
    """A lease whose blocks the engine frees now: nobody will pull them any more."""

    lease_id: str
    remote_request_id: str
    state: str


_LOCK_GENERATION_SQL = "SELECT generation FROM engines WHERE engine_id = :id FOR UPDATE"
_GENERATION_SQL = "SELECT generation FROM engines WHERE engine_id = :id"


async def engine_row(conn: AsyncConnection, engine_id: str) -> Row | None:
    """The engine's row (without retained-block totals), or None."""
    row = (
        await conn.execute(text(f"SELECT {ENGINE_COLUMNS} FROM engines e WHERE e.engine_id = :id"), {"id": engine_id})
    ).first()
    return None if row is None else row._mapping


class RetainedTotals:
    """Per-engine retained blocks, recomputed at most every `max_age` seconds.

    Summing live leases per engine on every ListEngines or Heartbeat grew with the number
    of leases (35 ms per call at 20,000); the totals are a load signal and a memory
    figure, so a value at most `max_age` old serves every caller (and the gauges) from one scan.
    """

    def __init__(self, owner: AsyncEngine, max_age: float = 2.0):
        self.owner = owner
        self.max_age = max_age
        self.values: dict[str, int] = {}
        self.at = float("-inf")
        self._lock = asyncio.Lock()

    async def get(self) -> dict[str, int]:
        """The totals, rescanned when older than `max_age` (one scan however many callers)."""
        if time.monotonic() - self.at < self.max_age:
            return self.values
        async with self._lock:
            if time.monotonic() - self.at >= self.max_age:
                async with self.owner.connect() as conn:
                    rows = await conn.execute(text(RETAINED_SQL))
                    self.values = {r.engine_id: int(r.blocks) for r in rows}
                self.at = time.monotonic()
        return self.values

    def with_totals(self, row: Row) -> Row:
        """The engine row with its `retained_blocks`."""
        return {**row, "retained_blocks": self.values.get(row["engine_id"], 0)}


class EngineStore:
    """RegisterEngine, Heartbeat, InvalidateEngine, ListEngines."""

    def __init__(self, owner: AsyncEngine, pool: TenantPool, retained: RetainedTotals, actor: str):
        self.owner = owner
        self.pool = pool
        self.retained = retained
        self.actor = actor

    async def register(self, spec: EngineSpec, request_id: str) -> tuple[Row, int]:
        """Upsert an engine generation; invalidate older generations' leases."""
        await self.retained.get()
        async with self.owner.begin() as conn:
            current = (await conn.execute(text(_LOCK_GENERATION_SQL), {"id": spec.engine_id})).scalar_one_or_none()
            if current is not None and spec.generation < current:
                raise failed_precondition(
                    "STALE_GENERATION",
                    f"engine {spec.engine_id!r} is at generation {current}; "
                    f"generation {spec.generation} is older and cannot register",
                )
            await conn.execute(text(REGISTER_ENGINE_SQL), spec.__dict__)
            invalidated = 0
            if current is not None and spec.generation > current:
                invalidated = await self._invalidate_leases(
                    conn,
                    "engine_id = :engine_id AND engine_generation < :below AND " + LIVE_LEASE_FILTER,
                    {"engine_id": spec.engine_id, "below": spec.generation},
                    "GENERATION_ADVANCED",
                    request_id,
                )
            row = await engine_row(conn, spec.engine_id)
            assert row is not None
            return self.retained.with_totals(row), invalidated

    async def heartbeat(
        self, engine_id: str, generation: int, in_flight: int, queued: int, free_blocks: int = 0,
        total_blocks: int = 0, take_releases: bool = False,
    ) -> tuple[Row, list[Released]]:
        """Record liveness, load and free KV blocks for the engine's current generation; take
        the releases pending for it (each is handed out once)."""
        await self.retained.get()
        params = {"engine_id": engine_id, "generation": generation, "in_flight": in_flight, "queued": queued,
                  "free_blocks": free_blocks, "total_blocks": total_blocks, "take_releases": take_releases}
        rows = await self.pool.fetch_global(HEARTBEAT_SQL, params, "Heartbeat")
        if rows:
            row = dict(rows[0])
            taken = row.pop("released") or []  # jsonb, decoded by the pool
            return self.retained.with_totals(row), [Released(str(a), str(b), str(c)) for a, b, c in taken]
        # Read after the update, not in its snapshot: a concurrent RegisterEngine that moved
        # the generation on is what this answer must name.
        known = await self.pool.fetch_global(_GENERATION_SQL, {"id": engine_id}, "Heartbeat")
        if not known:
            raise not_found("ENGINE_NOT_FOUND", f"engine {engine_id!r} is not registered; call RegisterEngine first")
        current = int(known[0]["generation"])
        raise failed_precondition(
            "STALE_GENERATION" if generation < current else "GENERATION_NOT_REGISTERED",
            f"engine {engine_id!r} is registered at generation {current}, not {generation}; "
            "call RegisterEngine with the engine's current generation",
        )

    async def invalidate(self, engine_id: str, below_generation: int, reason: str, request_id: str) -> int:
        """End an engine's live leases (older generations only when `below_generation` > 0)."""
        async with self.owner.begin() as conn:
            found = (await conn.execute(text(_LOCK_GENERATION_SQL), {"id": engine_id})).scalar_one_or_none()
            if found is None:
                raise not_found("ENGINE_NOT_FOUND", f"engine {engine_id!r} is not registered")
            where = "engine_id = :engine_id AND " + LIVE_LEASE_FILTER
            params: dict[str, Any] = {"engine_id": engine_id}
            if below_generation > 0:
                where += " AND engine_generation < :below"
                params["below"] = below_generation
            else:
                await conn.execute(text("UPDATE engines SET status = 'DEAD' WHERE engine_id = :id"), {"id": engine_id})
            return await self._invalidate_leases(conn, where, params, reason, request_id)

    async def listing(self, model: str, role: str) -> list[Row]:
        """Engines with their retained blocks (at most `RetainedTotals.max_age` old), by id."""
        await self.retained.get()
        async with self.owner.connect() as conn:
            rows = await conn.execute(
                text(
                    f"SELECT {ENGINE_COLUMNS} FROM engines e "
                    "WHERE (:model = '' OR e.model = :model) AND (:role = '' OR e.role = :role) "
                    "ORDER BY e.engine_id"
                ),
                {"model": model, "role": role},
            )
            return [self.retained.with_totals(r._mapping) for r in rows]

    async def _invalidate_leases(
        self, conn: AsyncConnection, where: str, params: dict[str, Any], reason: str, request_id: str
    ) -> int:
        """Move the leases `where` selects (any tenant's) to INVALIDATED, one event each."""
        sql = TRANSITION_SQL.format(where=where, extra_set="")
        result = await conn.execute(
            text(sql),
            {**params, "to_state": LeaseState.INVALIDATED.value, "reason": reason, "actor": self.actor,
             "request_id": request_id, "event_claim_id": ""},
        )
        return len(result.all())
