"""The registry's SQL edge: every statement that reads or changes lease state.

Each public method is one transaction, and every lease state change in it appends its
`lease_events` row in the same statement. Expiry is always decided against the database's
`now()`. The claim is a single statement on the `(tenant, conversation_id)` live-lease
index; the prefix comparison runs inside it (`boomerang_common_tokens`).
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import asyncpg
from boomerang.errors import BoomerangError, Code, failed_precondition, not_found
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from boomerang_registry.domain import (
    Candidate,
    ClaimOutcome,
    ClaimQuery,
    EngineSpec,
    LeaseState,
    RetainedBlocks,
    explain_no_claim,
)
from boomerang_registry.rawsql import SET_TENANTS_LOCAL, TenantPool, db_span
from boomerang_registry.statements import (
    CLAIM_BATCH_SQL,
    CLAIM_SQL,
    CLAIMED_LEASE_WHERE,
    CONSUME_SQL,
    ENGINE_COLUMNS,
    LEASE_COLUMNS,
    LIVE_LEASE_FILTER,
    REGISTER_BATCH_SQL,
    REGISTER_SQL,
    RELEASE_TARGET_SQL,
    TRANSITION_SQL,
)
from boomerang_registry.totals import RetainedTotals

Row = Mapping[Any, Any]  # a result row by column name (SQLAlchemy's RowMapping keys by str or Column)


def _encode_page_token(created_at: datetime, lease_id: str) -> str:
    raw = json.dumps([created_at.isoformat(), lease_id]).encode()
    return base64.urlsafe_b64encode(raw).decode()


def decode_page_token(token: str) -> tuple[datetime, str]:
    """The (created_at, lease_id) position a page token encodes; ValueError when malformed."""
    try:
        created, lease_id = json.loads(base64.urlsafe_b64decode(token.encode()))
        return datetime.fromisoformat(created), str(uuid.UUID(lease_id))
    except Exception as exc:
        raise ValueError("page_token is not one this service issued") from exc


async def set_tenant(conn: AsyncConnection, tenant: str) -> None:
    """Scope the current transaction to `tenant` for row-level security."""
    await conn.execute(text("SELECT set_config('boomerang.tenant', :t, true)"), {"t": tenant})


def _rounds(keys: Sequence[tuple[str, str]]) -> list[list[int]]:
    """Positions of `keys` in rounds holding each (tenant, conversation) at most once, in order."""
    rounds: list[list[int]] = []
    seen: list[set[tuple[str, str]]] = []
    for n, key in enumerate(keys):
        k = next((k for k, used in enumerate(seen) if key not in used), len(rounds))
        if k == len(rounds):
            rounds.append([])
            seen.append(set())
        rounds[k].append(n)
        seen[k].add(key)
    return rounds


# REGISTER_BATCH_SQL's per-registration arrays (from `_register_params`).
_REGISTER_BATCH_ARRAYS = (
    "lease_id", "tenant", "conversation_id", "model", "engine_id", "generation", "remote_request_id",
    "block_ids", "num_blocks", "num_tokens", "block_size", "chain", "tail_hash", "remote_host",
    "remote_port", "finished_at", "request_id",
)


def _claim_params(q: ClaimQuery) -> dict[str, Any]:
    """CLAIM_SQL's parameters of one claim but `actor` (CLAIM_BATCH_SQL takes each as an array)."""
    return {
        "tenant": q.tenant,
        "conversation_id": q.conversation_id,
        "claim_id": q.claim_id,
        "block_size": q.chain.block_size,
        "chain": q.chain.block_hashes,
        "tail_hash": q.chain.tail_hash,
        "num_tokens": q.chain.num_tokens,
        "model": q.model,
        "min_tokens": q.min_reusable_tokens,
        "min_remaining": q.min_remaining_seconds,
    }


def claim_result(q: ClaimQuery, rows: Sequence[Row]) -> tuple[ClaimOutcome, Row | None, int, float]:
    """A claim statement's rows for `q` as (outcome, lease, tokens, remaining)."""
    by_kind: dict[str, list[Row]] = {}
    for row in rows:
        by_kind.setdefault(row["kind"], []).append(row)
    chosen = next(iter(by_kind.get("claimed") or by_kind.get("prior") or ()), None)
    if chosen is not None:
        return ClaimOutcome.CLAIMED, chosen, int(chosen["common_tokens"]), float(chosen["remaining_seconds"])
    candidates = {
        r["lease_id"]: Candidate(
            lease_id=r["lease_id"],
            state=LeaseState(r["state"]),
            engine_ok=bool(r["engine_ok"]),
            block_size_ok=bool(r["block_size_ok"]),
            common_tokens=int(r["common_tokens"]),
            remaining_seconds=float(r["remaining_seconds"]),
        )
        for r in by_kind.get("candidate", [])
    }
    outcome, best = explain_no_claim(list(candidates.values()), q.min_reusable_tokens, q.min_remaining_seconds)
    if best is None:
        return outcome, None, 0, 0.0
    lease = next(r for r in by_kind["candidate"] if r["lease_id"] == best.lease_id)
    return outcome, lease, best.common_tokens, best.remaining_seconds


def lost_the_row_lock(result: tuple[ClaimOutcome, Row | None, int, float]) -> bool:
    """Whether a claim found its lease free but lost the row lock to a concurrent claimer.

    The statement's snapshot predates the winner's commit, so it cannot tell whose claim won.
    When the winner is the same claim id (a caller's retry racing its first attempt), a
    fresh statement finds it as `prior` and answers it; otherwise it reads ALREADY_CLAIMED
    on a lease that is CLAIMED, which is not asked again.
    """
    outcome, lease, _, _ = result
    return outcome is ClaimOutcome.ALREADY_CLAIMED and lease is not None and lease["state"] == "RETAINED"


class RegistryRepository:
    """Postgres access for the registry; one transaction per method."""

    def __init__(
        self,
        engine: AsyncEngine,
        ttl_margin_seconds: float,
        actor: str = "registry",
        tenant_engine: AsyncEngine | None = None,
        raw: TenantPool | None = None,
    ):
        self.engine = engine
        self.retained = RetainedTotals()
        # The claim and the group commit go through `raw` (plain asyncpg, rawsql.py) when
        # given; the same statements otherwise run through `tenant_engine`.
        self.raw = raw
        # Tenant-scoped statements run on `tenant_engine` (the row-level-security role of
        # migration 0006) with `boomerang.tenant` set; cross-tenant work uses `engine`.
        self.tenant_engine = tenant_engine or engine
        self.ttl_margin_seconds = ttl_margin_seconds
        self.actor = actor

    @asynccontextmanager
    async def tenant_transaction(self, tenant: str) -> AsyncIterator[AsyncConnection]:
        """A transaction that sees and changes only `tenant`'s leases and events."""
        async with self.tenant_engine.begin() as conn:
            await set_tenant(conn, tenant)
            yield conn

    # -- engines -------------------------------------------------------------------------

    async def register_engine(self, spec: EngineSpec, request_id: str) -> tuple[Row, int]:
        """Upsert an engine generation; invalidate older generations' leases."""
        await self.retained.get(self.engine)
        async with self.engine.begin() as conn:
            current = (
                await conn.execute(
                    text("SELECT generation FROM engines WHERE engine_id = :id FOR UPDATE"),
                    {"id": spec.engine_id},
                )
            ).scalar_one_or_none()
            if current is not None and spec.generation < current:
                raise failed_precondition(
                    "STALE_GENERATION",
                    f"engine {spec.engine_id!r} is at generation {current}; "
                    f"generation {spec.generation} is older and cannot register",
                )
            await conn.execute(
                text(
                    """
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
                ),
                {**spec.__dict__, "role": spec.role.value},
            )
            invalidated = 0
            if current is not None and spec.generation > current:
                invalidated = await self._transition(
                    conn,
                    "engine_id = :engine_id AND engine_generation < :below AND " + LIVE_LEASE_FILTER,
                    {"engine_id": spec.engine_id, "below": spec.generation},
                    LeaseState.INVALIDATED,
                    "GENERATION_ADVANCED",
                    request_id,
                )
            row = await self._engine(conn, spec.engine_id)
            assert row is not None
            return row, invalidated

    async def heartbeat(self, engine_id: str, generation: int, in_flight: int, queued: int) -> Row:
        """Record liveness and load for the engine's current generation."""
        await self.retained.get(self.engine)
        async with self.engine.begin() as conn:
            current = (
                await conn.execute(
                    text(
                        """
                    UPDATE engines SET heartbeat_at = now(), status = 'ACTIVE',
                        in_flight_requests = :in_flight, queued_prompt_tokens = :queued
                    WHERE engine_id = :engine_id AND generation = :generation
                    RETURNING engine_id"""
                    ),
                    {"engine_id": engine_id, "generation": generation, "in_flight": in_flight, "queued": queued},
                )
            ).scalar_one_or_none()
            if current is None:
                known = (
                    await conn.execute(
                        text("SELECT generation FROM engines WHERE engine_id = :id"), {"id": engine_id}
                    )
                ).scalar_one_or_none()
                if known is None:
                    raise not_found("ENGINE_NOT_FOUND", f"engine {engine_id!r} is not registered; call RegisterEngine first")
                raise failed_precondition(
                    "STALE_GENERATION" if generation < known else "GENERATION_NOT_REGISTERED",
                    f"engine {engine_id!r} is registered at generation {known}, not {generation}; "
                    "call RegisterEngine with the engine's current generation",
                )
            row = await self._engine(conn, engine_id)
            assert row is not None
            return row

    async def invalidate_engine(self, engine_id: str, below_generation: int, reason: str, request_id: str) -> int:
        """End an engine's live leases (older generations only when `below_generation` > 0)."""
        async with self.engine.begin() as conn:
            found = (
                await conn.execute(
                    text("SELECT generation FROM engines WHERE engine_id = :id FOR UPDATE"), {"id": engine_id}
                )
            ).scalar_one_or_none()
            if found is None:
                raise not_found("ENGINE_NOT_FOUND", f"engine {engine_id!r} is not registered")
            where = "engine_id = :engine_id AND " + LIVE_LEASE_FILTER
            params: dict[str, Any] = {"engine_id": engine_id}
            if below_generation > 0:
                where += " AND engine_generation < :below"
                params["below"] = below_generation
            else:
                await conn.execute(text("UPDATE engines SET status = 'DEAD' WHERE engine_id = :id"), {"id": engine_id})
            return await self._transition(conn, where, params, LeaseState.INVALIDATED, reason, request_id)

    async def list_engines(self, model: str, role: str) -> list[Row]:
        """Engines with their retained blocks (at most `RetainedTotals.max_age` old), by id."""
        await self.retained.get(self.engine)
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                text(
                    f"SELECT {ENGINE_COLUMNS} FROM engines e "
                    "WHERE (:model = '' OR e.model = :model) AND (:role = '' OR e.role = :role) "
                    "ORDER BY e.engine_id"
                ),
                {"model": model, "role": role},
            )
            return [self.retained.with_totals(r._mapping) for r in rows]

    # -- leases --------------------------------------------------------------------------

    async def register_blocks(self, req: RetainedBlocks) -> tuple[Row, bool, int]:
        """Record a retained turn as a lease (idempotent); returns (lease, created, superseded)."""
        async with self.tenant_engine.begin() as conn:
            return await self.register_blocks_in(conn, req)

    async def register_blocks_in(self, conn: AsyncConnection, req: RetainedBlocks) -> tuple[Row, bool, int]:
        """`register_blocks` inside the caller's transaction (for group commit)."""
        await set_tenant(conn, req.tenant)
        row = (await conn.execute(text(REGISTER_SQL), self._register_params(req))).first()
        if row is not None:
            lease = row._mapping
            return lease, True, int(lease["superseded"])
        return await self._explain_register_conflict(req), False, 0

    async def register_blocks_batch_raw(
        self, conn: asyncpg.Connection, reqs: Sequence[RetainedBlocks]
    ) -> list[tuple[Row, bool, int] | BoomerangError]:
        """Many `register_blocks_in` on a raw connection of `self.raw` in the caller's
        transaction, one REGISTER_BATCH_SQL per round (a round holds at most one registration
        per conversation; later ones on the same conversation go in later rounds, so they
        supersede the earlier, in order)."""
        assert self.raw is not None
        out: list[tuple[Row, bool, int] | BoomerangError | None] = [None] * len(reqs)
        set_tenants = self.raw.compile(SET_TENANTS_LOCAL)[0]
        for members in _rounds([(r.tenant, r.conversation_id) for r in reqs]):
            batch = [reqs[n] for n in members]
            each = [self._register_params(r) for r in batch]
            params: dict[str, Any] = {k: [p[k] for p in each] for k in _REGISTER_BATCH_ARRAYS}
            params.update(i=list(range(len(batch))), margin=self.ttl_margin_seconds, actor=self.actor)
            query, args = self.raw.args(REGISTER_BATCH_SQL, params)
            await conn.execute(set_tenants, " ".join(sorted({r.tenant for r in batch})))
            with db_span("RegisterRetainedBlocks"):
                rows = await conn.fetch(query, *args)
            found = {row["i"]: row for row in rows}
            for j, n in enumerate(members):
                row = found.get(j)
                if row is not None:
                    out[n] = (row, True, int(row["superseded"]))
                    continue
                try:
                    out[n] = (await self._explain_register_conflict(batch[j]), False, 0)
                except BoomerangError as err:
                    out[n] = err
        return [o for o in out if o is not None]

    def _register_params(self, req: RetainedBlocks) -> dict[str, Any]:
        return {
            "lease_id": str(uuid.uuid4()),
            "tenant": req.tenant,
            "conversation_id": req.conversation_id,
            "model": req.model,
            "engine_id": req.engine_id,
            "generation": req.engine_generation,
            "remote_request_id": req.remote_request_id,
            "block_ids": json.dumps(req.block_groups),
            "num_blocks": req.num_blocks,
            "num_tokens": req.num_tokens,
            "block_size": req.chain.block_size,
            "chain": req.chain.block_hashes,
            "tail_hash": req.chain.tail_hash,
            "remote_host": req.remote_host,
            "remote_port": req.remote_port,
            "finished_at": req.finish_time,
            "margin": self.ttl_margin_seconds,
            "actor": self.actor,
            "request_id": req.request_id,
        }

    async def _explain_register_conflict(self, req: RetainedBlocks) -> Row:
        # Across tenants on purpose (owner connection): the natural key is global.
        async with self.engine.connect() as conn:
            return await self._explain_register_conflict_in(conn, req)

    async def _explain_register_conflict_in(self, conn: AsyncConnection, req: RetainedBlocks) -> Row:
        existing = (
            await conn.execute(
                text(
                    f"SELECT {LEASE_COLUMNS} FROM leases l WHERE l.engine_id = :e "
                    "AND l.engine_generation = :g AND l.remote_request_id = :r"
                ),
                {"e": req.engine_id, "g": req.engine_generation, "r": req.remote_request_id},
            )
        ).first()
        if existing is not None:
            lease = existing._mapping
            if (lease["tenant"], lease["conversation_id"]) != (req.tenant, req.conversation_id):
                raise BoomerangError(
                    Code.ALREADY_EXISTS,
                    "REQUEST_ALREADY_REGISTERED",
                    f"remote_request_id {req.remote_request_id!r} of engine {req.engine_id!r} is "
                    "already registered for another conversation",
                )
            return lease
        engine = await self._engine(conn, req.engine_id)
        if engine is None:
            raise failed_precondition(
                "ENGINE_NOT_REGISTERED",
                f"engine {req.engine_id!r} is not registered; call RegisterEngine first",
            )
        if engine["role"] != "DECODE":
            raise failed_precondition("NOT_A_DECODE_ENGINE", f"engine {req.engine_id!r} is a prefill engine")
        if engine["generation"] != req.engine_generation:
            raise failed_precondition(
                "STALE_GENERATION" if req.engine_generation < engine["generation"] else "GENERATION_NOT_REGISTERED",
                f"engine {req.engine_id!r} is at generation {engine['generation']}, "
                f"not {req.engine_generation}",
            )
        if engine["status"] != "ACTIVE":
            raise failed_precondition("ENGINE_DEAD", f"engine {req.engine_id!r} is not active")
        raise failed_precondition(
            "BLOCK_SIZE_MISMATCH",
            f"token_chain.block_size {req.chain.block_size} differs from engine "
            f"{req.engine_id!r}'s block size {engine['block_size']}",
        )

    async def claim(self, q: ClaimQuery) -> tuple[ClaimOutcome, Row | None, int, float]:
        """Claim the best live lease in one statement; returns (outcome, lease, tokens, remaining).

        A claim that lost its lease's row lock looks once more (see `lost_the_row_lock`).
        """
        result = await self._claim(q)
        return await self._claim(q) if lost_the_row_lock(result) else result

    async def _claim(self, q: ClaimQuery) -> tuple[ClaimOutcome, Row | None, int, float]:
        params = {**_claim_params(q), "actor": self.actor}
        rows: Sequence[Row]
        if self.raw is not None:
            rows = await self.raw.fetch_as(q.tenant, CLAIM_SQL, params, "ClaimReuse")
        else:
            async with self.tenant_transaction(q.tenant) as conn:
                rows = [r._mapping for r in await conn.execute(text(CLAIM_SQL), params)]
        return claim_result(q, rows)

    async def claim_batch(self, queries: Sequence[ClaimQuery]) -> list[tuple[ClaimOutcome, Row | None, int, float]]:
        """Each claim as `claim` answers it, in order; one statement per round of claims.

        A round holds at most one claim per conversation (CLAIM_BATCH_SQL's rule); a second
        claim on the same conversation goes in the next round, which runs after the first
        committed and so sees its claim (as two calls in a row would). Claims that lost a
        row lock look once more, together.
        """
        results = await self._claim_batch(queries)
        again = [n for n, result in enumerate(results) if lost_the_row_lock(result)]
        if again:
            for n, result in zip(again, await self._claim_batch([queries[n] for n in again]), strict=True):
                results[n] = result
        return results

    async def _claim_batch(self, queries: Sequence[ClaimQuery]) -> list[tuple[ClaimOutcome, Row | None, int, float]]:
        results: list[tuple[ClaimOutcome, Row | None, int, float] | None] = [None] * len(queries)
        for members in _rounds([(q.tenant, q.conversation_id) for q in queries]):
            batch = [queries[n] for n in members]
            each = [_claim_params(q) for q in batch]
            params: dict[str, Any] = {k: [p[k] for p in each] for k in each[0]}  # a round is never empty
            params.update(i=list(range(len(batch))), actor=self.actor)
            tenants = sorted({q.tenant for q in batch})
            rows: Sequence[Row]
            if self.raw is not None:
                rows = await self.raw.fetch_for_tenants(tenants, CLAIM_BATCH_SQL, params, "ClaimReuseBatch")
            else:
                async with self.tenant_engine.begin() as conn:
                    await conn.execute(text(SET_TENANTS_LOCAL), {"t": " ".join(tenants)})
                    rows = [r._mapping for r in await conn.execute(text(CLAIM_BATCH_SQL), params)]
            per_claim: list[list[Row]] = [[] for _ in batch]
            for row in rows:
                per_claim[row["i"]].append(row)
            for j, n in enumerate(members):
                results[n] = claim_result(batch[j], per_claim[j])
        return [r for r in results if r is not None]

    async def release_claim(self, tenant: str, lease_id: str, claim_id: str, reason: str) -> Row:
        """CLAIMED → RETAINED when still live and newest, else the state it should end in."""
        async with self.tenant_transaction(tenant) as conn:
            lease = await self._locked_lease(conn, tenant, lease_id)
            if lease["state"] != "CLAIMED":
                if await self._claim_held(conn, lease_id, claim_id):
                    return lease  # released or ended already: repeating changes nothing
                raise failed_precondition(
                    "CLAIM_MISMATCH", f"lease {lease_id} was never held by claim {claim_id!r}"
                )
            if lease["claim_id"] != claim_id:
                raise failed_precondition(
                    "CLAIM_MISMATCH", f"lease {lease_id} is held by another claim, not {claim_id!r}"
                )
            target = LeaseState(
                (await conn.execute(text(RELEASE_TARGET_SQL), {"id": lease_id})).scalar_one()
            )
            released = target is LeaseState.RETAINED
            await self._transition(
                conn,
                CLAIMED_LEASE_WHERE,
                {"id": lease_id, "tenant": tenant},
                target,
                reason if released else f"{reason}:{target.value}",
                claim_id,
                extra_set=", claim_id = NULL" if released else "",
                event_claim_id=claim_id,
            )
            row = await self._lease(conn, lease_id)
            assert row is not None
            return row

    async def mark_consumed(self, tenant: str, lease_id: str, claim_id: str) -> Row:
        """CLAIMED → CONSUMED for the claim that read it (repeats are no-ops): one statement
        (CONSUME_SQL) on the raw pool, as a claim is, else in a transaction."""
        params = {"tenant": tenant, "id": lease_id, "claim_id": claim_id, "actor": self.actor}
        rows: Sequence[Row]
        if self.raw is not None:
            rows = await self.raw.fetch_as(tenant, CONSUME_SQL, params, "MarkConsumed")
        else:
            async with self.tenant_transaction(tenant) as conn:
                rows = [r._mapping for r in await conn.execute(text(CONSUME_SQL), params)]
        if not rows:
            raise not_found("LEASE_NOT_FOUND", f"lease {lease_id} does not exist for this tenant")
        lease = rows[0]
        if lease["moved"]:
            return lease
        if lease["claim_id"] != claim_id:
            raise failed_precondition("CLAIM_MISMATCH", f"lease {lease_id} is not held by claim {claim_id!r}")
        if lease["state"] == "CONSUMED":
            return lease
        raise failed_precondition(f"LEASE_{lease['state']}", f"lease {lease_id} is {lease['state']}, not claimed")

    async def _locked_lease(self, conn: AsyncConnection, tenant: str, lease_id: str) -> Row:
        row = (
            await conn.execute(
                text(
                    f"SELECT {LEASE_COLUMNS} FROM leases l "
                    "WHERE l.lease_id = CAST(:id AS uuid) AND l.tenant = :t FOR UPDATE"
                ),
                {"id": lease_id, "t": tenant},
            )
        ).first()
        if row is None:
            raise not_found("LEASE_NOT_FOUND", f"lease {lease_id} does not exist for this tenant")
        return row._mapping

    async def _claim_held(self, conn: AsyncConnection, lease_id: str, claim_id: str) -> bool:
        return bool(
            (
                await conn.execute(
                    text(
                        "SELECT EXISTS (SELECT 1 FROM lease_events WHERE lease_id = CAST(:id AS uuid) "
                        "AND claim_id = :c AND to_state = 'CLAIMED')"
                    ),
                    {"id": lease_id, "c": claim_id},
                )
            ).scalar_one()
        )

    async def get_conversation(self, tenant: str, conversation_id: str, include_events: bool) -> tuple[list[Row], list[Row]]:
        """A conversation's newest 100 leases and, if asked, their events."""
        async with self.tenant_transaction(tenant) as conn:
            leases: list[Row] = [
                r._mapping
                for r in await conn.execute(
                    text(
                        f"SELECT {LEASE_COLUMNS} FROM leases l WHERE l.tenant = :t AND l.conversation_id = :c "
                        "ORDER BY l.created_at DESC, l.lease_id DESC LIMIT 100"
                    ),
                    {"t": tenant, "c": conversation_id},
                )
            ]
            if not leases:
                raise not_found(
                    "CONVERSATION_NOT_FOUND", f"no leases recorded for conversation {conversation_id!r}"
                )
            events: list[Row] = []
            if include_events:
                events = [
                    r._mapping
                    for r in await conn.execute(
                        text(
                            "SELECT event_id, lease_id::text AS lease_id, from_state, to_state, reason, actor, "
                            "request_id, claim_id, created_at FROM lease_events "
                            "WHERE tenant = :t AND conversation_id = :c ORDER BY event_id"
                        ),
                        {"t": tenant, "c": conversation_id},
                    )
                ]
            return leases, events

    async def list_leases(
        self, tenant: str, engine_id: str, states: Sequence[str], page_size: int, page_token: str
    ) -> tuple[list[Row], str]:
        """A page of leases newest first, and the next page's token."""
        clauses = ["TRUE"]
        params: dict[str, Any] = {"limit": page_size + 1}
        if tenant:
            clauses.append("l.tenant = :tenant")
            params["tenant"] = tenant
        if engine_id:
            clauses.append("l.engine_id = :engine_id")
            params["engine_id"] = engine_id
        if states:
            clauses.append("l.state = ANY(CAST(:states AS text[]))")
            params["states"] = list(states)
        if page_token:
            created, last_id = decode_page_token(page_token)
            clauses.append("(l.created_at, l.lease_id) < (:after_created, CAST(:after_id AS uuid))")
            params.update(after_created=created, after_id=last_id)
        sql = (
            f"SELECT {LEASE_COLUMNS} FROM leases l WHERE {' AND '.join(clauses)} "
            "ORDER BY l.created_at DESC, l.lease_id DESC LIMIT :limit"
        )
        if tenant:
            async with self.tenant_transaction(tenant) as conn:
                rows: list[Row] = [r._mapping for r in await conn.execute(text(sql), params)]
        else:  # an operator's listing across tenants
            async with self.engine.connect() as conn:
                rows = [r._mapping for r in await conn.execute(text(sql), params)]
        next_token = ""
        if len(rows) > page_size:
            rows = rows[:page_size]
            next_token = _encode_page_token(rows[-1]["created_at"], rows[-1]["lease_id"])
        return rows, next_token

    # -- helpers -------------------------------------------------------------------------

    async def _transition(
        self,
        conn: AsyncConnection,
        where: str,
        params: dict[str, Any],
        to_state: LeaseState,
        reason: str,
        request_id: str,
        extra_set: str = "",
        event_claim_id: str = "",
    ) -> int:
        sql = TRANSITION_SQL.format(where=where, extra_set=extra_set)
        result = await conn.execute(
            text(sql),
            {
                **params,
                "to_state": to_state.value,
                "reason": reason,
                "actor": self.actor,
                "request_id": request_id,
                "event_claim_id": event_claim_id,
            },
        )
        return len(result.all())

    async def _lease(self, conn: AsyncConnection, lease_id: str) -> Row | None:
        row = (
            await conn.execute(
                text(f"SELECT {LEASE_COLUMNS} FROM leases l WHERE l.lease_id = CAST(:id AS uuid)"), {"id": lease_id}
            )
        ).first()
        return None if row is None else row._mapping

    async def _engine(self, conn: AsyncConnection, engine_id: str) -> Row | None:
        row = (
            await conn.execute(text(f"SELECT {ENGINE_COLUMNS} FROM engines e WHERE e.engine_id = :id"), {"id": engine_id})
        ).first()
        return None if row is None else self.retained.with_totals(row._mapping)
