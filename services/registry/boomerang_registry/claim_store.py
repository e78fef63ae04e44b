"""Claims and what ends them: ClaimReuse (one or a batch), and CompleteTurn's consume or release.

All on the hot-path pool (below) as the claim's tenant. A claim is one statement on the
`(tenant, conversation_id)` live-lease index, the prefix comparison inside it
(`boomerang_common_tokens`); without a conversation id, one statement on the
`(tenant, prompt_key)` index instead (below); a consume is one statement; a release is one short
transaction. Every state change appends its `lease_events` row in the same statement.

Without a conversation id, a claim takes the lease whose previous prompt the new one
continues. A lease's previous prompt of `p` tokens is wholly a prefix of the new prompt when
(1) the new prompt's chain equals the lease's through block `p // block_size` (its key, the
    hash of that last whole block, is among the new prompt's; the chain comparison then
    proves it, so an 8-byte key collision claims nothing), and
(2) the prompt's partial last block, `p % block_size` tokens, recurs in the new prompt right
    after those blocks (the lease's `prompt_tail` digest, recomputed from the new prompt's
    token ids).
A lease that shares only a start with the new prompt (a system prompt, a tool list) fails
(1) or (2) and is never a candidate: claiming it would take another conversation's next
turn. Nor is the previous prompt itself, sent again (a regenerated answer, or a client
without an id asking the same thing): a continuation is strictly longer than what it
continues, and that lease stays for its own next turn. Of the leases the prompt continues,
the one with the longest previous prompt wins; the claim then is CLAIM_SQL's, built by the
same statements.claim_statement: the verified prefix, single use, the CLAIMED event in the
same statement. One statement, one index: `ix_leases_live_prompt_key`, probed with every
whole-block key of the new prompt (tokenchain.probe_keys).

The hot-path pool (`TenantPool`, plain asyncpg) is here too: the claim is its hottest user,
and the other tenant-scoped stores (registrations, heartbeats, a conversation's trail) share
it.

`boomerang bench --profile` showed a claim through SQLAlchemy costing several round trips
besides the statement itself (the pool's pre-ping, BEGIN, `set_config`, COMMIT) and
SQLAlchemy's per-execute work in the registry's event loop. Here a claim is `set_config` of
the tenant for the session, then the claim as one autocommit statement (one statement is
one transaction, so it stays atomic): two short round trips, no BEGIN/COMMIT. Connections
run as the row-level-security role (migration 0006), with generic plans forced so the long
claim statement is planned once per connection rather than on each call.

Every use that reads or changes leases or events sets `boomerang.tenant` and
`boomerang.tenants` (a batch's tenants) before its statement on a connection it holds
exclusively, so a session-level setting left on a pooled connection is never relied on;
that is also why a connection goes back to the pool without asyncpg's reset query. The one
use that sets no tenant (`fetch_global`) touches only `engines`, which has no row-level
security.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg
from boomerang import telemetry
from boomerang.errors import failed_precondition, not_found
from boomerang.tokenchain import probe_keys
from boomerang_server.config import asyncpg_dsn
from boomerang_server.leases import ClaimOutcome, LeaseState

from boomerang_registry.statements import (
    CLAIM_BATCH_SQL,
    CLAIM_SQL,
    CONSUME_SQL,
    LEASE_COLUMNS,
    LEASE_SQL,
    RELEASE_ENDED_SQL,
    RELEASE_SQL,
    RELEASE_TARGET_SQL,
    EpochFence,
    claim_statement,
    epoch_changed,
)
from boomerang_registry.wire import ClaimQuery

Row = Mapping[Any, Any]  # a result row by column name (an asyncpg Record, or SQLAlchemy's RowMapping)

_NAMED = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")
# Each sets both settings, so a batch's tenant list never outlives the use that set it.
SET_TENANT_SESSION = "SELECT set_config('boomerang.tenant', $1, false), set_config('boomerang.tenants', '', false)"
SET_TENANT_LOCAL = "SELECT set_config('boomerang.tenant', $1, true), set_config('boomerang.tenants', '', true)"
# A batch's tenants (space-separated), no single tenant (migration 0007).
SET_TENANTS_SESSION = "SELECT set_config('boomerang.tenant', '', false), set_config('boomerang.tenants', $1, false)"
SET_TENANTS_LOCAL = "SELECT set_config('boomerang.tenant', '', true), set_config('boomerang.tenants', :t, true)"

SET_SYSTEM_IDENTIFIER = (
    "SELECT set_config('boomerang.system_identifier', system_identifier::text, false) FROM pg_control_system()"
)


def positional(sql: str) -> tuple[str, list[str]]:
    """`:name` parameters (SQLAlchemy style) as asyncpg's `$n`; the names in order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return _NAMED.sub(number, sql), names


def rounds(keys: Sequence[tuple[str, str]]) -> list[list[int]]:
    """Positions of `keys` in rounds holding each (tenant, conversation) at most once, in order.

    A batched statement takes at most one item per conversation (two claims could pick the
    same lease; a second registration must see the first's lease to supersede it); later
    items on the same conversation go in later rounds, which see the earlier ones' effects.
    """
    out: list[list[int]] = []
    seen: list[set[tuple[str, str]]] = []
    for n, key in enumerate(keys):
        k = next((k for k, used in enumerate(seen) if key not in used), len(out))
        if k == len(out):
            out.append([])
            seen.append(set())
        out[k].append(n)
        seen[k].add(key)
    return out


@contextmanager
def db_span(operation: str) -> Iterator[None]:
    """A client span for a statement when tracing is on (SQLAlchemy's instrumentation does not
    see this pool)."""
    if not telemetry.enabled():
        yield
        return
    # deferred: OpenTelemetry loads only once tracing is on
    from opentelemetry import trace

    tracer = trace.get_tracer("boomerang.registry")
    with tracer.start_as_current_span(
        operation, kind=trace.SpanKind.CLIENT,
        attributes={"db.system": "postgresql", "db.operation.name": operation},
    ):
        yield


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Release without asyncpg's default reset query (a round trip per release): every user
    of this pool sets the tenant before its statement, and asyncpg still rolls back a
    transaction left open."""


async def _init(conn: asyncpg.Connection) -> None:
    # As SQLAlchemy's asyncpg dialect does: jsonb parameters go as the JSON text the
    # repository already made, results come back decoded.
    await conn.set_type_codec("jsonb", encoder=str, decoder=json.loads, schema="pg_catalog")
    # The server's system identifier for the failover fence's per-statement check (migration
    # 0011): read from the control file once per connection, not on every claim. A session
    # lives on one server, so the value never goes stale.
    await conn.execute(SET_SYSTEM_IDENTIFIER)


class TenantPool:
    """An asyncpg pool for tenant-scoped hot-path statements."""

    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool
        self._compiled: dict[str, tuple[str, list[str]]] = {}

    @classmethod
    async def open(
        cls,
        url: str,
        size: int,
        role: str = "",
        application_name: str = "boomerang-registry",
        warm: Sequence[tuple[str, Mapping[str, Any]]] = (),
    ) -> TenantPool:
        """Connect `size` connections (as `role` when given).

        Each new connection runs the `warm` statements once (with no tenant set, so they see
        and change nothing): the hot statements are then prepared and planned, and the
        prefix function compiled, before the first call that needs them."""
        settings = {"application_name": application_name, "plan_cache_mode": "force_generic_plan", "jit": "off"}
        if role:
            settings["role"] = role
        warm_args = []
        for sql, params in warm:
            query, names = positional(sql)
            warm_args.append((query, [params[n] for n in names]))

        async def init(conn: asyncpg.Connection) -> None:
            await _init(conn)
            for query, args in warm_args:
                try:
                    await conn.fetch(query, *args)
                except asyncpg.PostgresError as exc:
                    # A new connection after a failover, before the fence ran: the connection
                    # is sound, and its first claim runs the fence (statements.EpochFence).
                    if not epoch_changed(exc):
                        raise
                    return

        dsn = asyncpg_dsn(url)
        pool = await asyncpg.create_pool(dsn, min_size=size, max_size=size, init=init, reset=_keep_session,
                                         server_settings=settings, command_timeout=10, timeout=5)
        return cls(pool)

    async def close(self) -> None:
        """Close every connection."""
        await self.pool.close()

    def compile(self, sql: str) -> tuple[str, list[str]]:
        """The positional form of `sql` (cached)."""
        found = self._compiled.get(sql)
        if found is None:
            found = self._compiled[sql] = positional(sql)
        return found

    def args(self, sql: str, params: Mapping[str, Any]) -> tuple[str, list[Any]]:
        """The positional statement and its arguments."""
        query, names = self.compile(sql)
        return query, [params[n] for n in names]

    async def fetch_as(
        self, tenant: str | Sequence[str], sql: str, params: Mapping[str, Any], operation: str
    ) -> Sequence[asyncpg.Record]:
        """Run one statement (its own transaction) as `tenant`, or as a batch's tenants (a list
        of them, and no single tenant); its rows.

        Two round trips: the setting is the session's, and every use of this pool sets both
        `boomerang.tenant` and `boomerang.tenants` before its statement (SET_TENANT_SESSION,
        SET_TENANTS_SESSION, SET_TENANT_LOCAL), so a tenant list left on a pooled connection
        is never in force for anything else."""
        query, args = self.args(sql, params)
        with db_span(operation):
            async with self.pool.acquire() as conn:
                if isinstance(tenant, str):
                    await conn.execute(SET_TENANT_SESSION, tenant)
                else:
                    await conn.execute(SET_TENANTS_SESSION, " ".join(tenant))
                return await conn.fetch(query, *args)  # type: ignore[no-any-return]

    async def fetch_global(self, sql: str, params: Mapping[str, Any], operation: str) -> Sequence[asyncpg.Record]:
        """Run one statement (its own transaction) on `engines` only: no tenant is set, and
        none left on the connection matters, since `engines` has no row-level security."""
        query, args = self.args(sql, params)
        with db_span(operation):
            async with self.pool.acquire() as conn:
                return await conn.fetch(query, *args)  # type: ignore[no-any-return]

    @asynccontextmanager
    async def transaction(self, tenant: str | None = None) -> AsyncIterator[Transaction]:
        """One connection in a transaction, as `tenant` when given (for this transaction only);
        otherwise the caller sets the tenants before each statement (`Transaction.as_tenants`)."""
        async with self.pool.acquire() as conn, conn.transaction():
            tx = Transaction(self, conn)
            if tenant is not None:
                await conn.execute(SET_TENANT_LOCAL, tenant)
            yield tx


class Transaction:
    """Named-parameter statements on one connection of a `TenantPool`, inside its transaction."""

    def __init__(self, pool: TenantPool, conn: asyncpg.Connection):
        self.pool = pool
        self.conn = conn
        self._tenants: str | None = None  # what `as_tenants` last set in this transaction

    async def as_tenants(self, tenants: Sequence[str]) -> None:
        """Scope the rest of the transaction to `tenants` (a batch's), and to no single tenant.

        Setting the same list again is skipped: a turn end sets its tenant for the claim's
        settlement, and its registration would set it once more (a round trip of nothing)."""
        joined = " ".join(tenants)
        if joined == self._tenants:
            return
        await self.conn.execute(self.pool.compile(SET_TENANTS_LOCAL)[0], joined)
        self._tenants = joined

    async def fetch(self, sql: str, params: Mapping[str, Any]) -> list[asyncpg.Record]:
        """The statement's rows."""
        query, args = self.pool.args(sql, params)
        return await self.conn.fetch(query, *args)  # type: ignore[no-any-return]

    async def fetchrow(self, sql: str, params: Mapping[str, Any]) -> asyncpg.Record | None:
        """The statement's first row, if any."""
        query, args = self.pool.args(sql, params)
        return await self.conn.fetchrow(query, *args)

    async def fetchval(self, sql: str, params: Mapping[str, Any]) -> Any:
        """The first column of the statement's first row."""
        query, args = self.pool.args(sql, params)
        return await self.conn.fetchval(query, *args)


# Claims.

ClaimAnswer = tuple[ClaimOutcome, Row | None, int, float]  # (outcome, lease, reusable tokens, remaining seconds)

_LOCKED_LEASE_SQL = f"SELECT {LEASE_COLUMNS} FROM leases l WHERE l.lease_id = CAST(:id AS uuid) AND l.tenant = :t FOR UPDATE"
_CLAIM_HELD_SQL = (
    "SELECT EXISTS (SELECT 1 FROM lease_events WHERE lease_id = CAST(:id AS uuid) "
    "AND claim_id = :c AND to_state = 'CLAIMED')"
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


# `:keys[k]` is the key of the new prompt's first k whole blocks; a lease qualifies only at
# its own position (its prompt's whole blocks), so a key seen elsewhere in the prompt does
# not. `prompt_tail` is SHA-256(hash of the prompt's last whole block ‖ its tail tokens).
# The longest previous prompt wins; the rest of the claim is every claim's (claim_statement).
CONTINUE_CLAIM_SQL = claim_statement(
    lease_key="l.tenant = :tenant",
    candidates="""hits AS (
    SELECT l.lease_id, l.state, l.expires_at, l.engine_id, l.engine_generation, l.prompt_tokens,
           CASE WHEN l.block_size = :block_size THEN
               boomerang_common_tokens(l.chain, l.tail_hash, l.num_tokens,
                                       :chain, :tail_hash, :num_tokens, l.block_size)
           ELSE 0 END AS common_tokens,
           (l.prompt_tokens / l.block_size)::int AS prompt_blocks, l.prompt_tail, l.chain, l.block_size
    FROM leases l
    WHERE l.tenant = :tenant AND l.prompt_key = ANY(CAST(:keys AS bigint[]))
      AND l.state IN ('RETAINED', 'CLAIMED') AND l.prompt_key IS NOT NULL
      AND l.block_size = :block_size AND l.prompt_tokens < :num_tokens
      AND (CAST(:keys AS bigint[]))[(l.prompt_tokens / l.block_size)::int] = l.prompt_key
      AND (:model = '' OR l.model = :model)
), cands AS (
    SELECT h.lease_id, h.state, h.expires_at, h.prompt_tokens, h.common_tokens,
           (e.status = 'ACTIVE' AND e.generation = h.engine_generation) AS engine_ok,
           TRUE AS block_size_ok,
           EXTRACT(EPOCH FROM h.expires_at - now())::float8 AS remaining_seconds
    FROM hits h JOIN engines e ON e.engine_id = h.engine_id
    WHERE h.common_tokens >= h.prompt_blocks * h.block_size
      AND (length(h.prompt_tail) = 0 OR h.prompt_tail = sha256(
              substring(h.chain FROM (h.prompt_blocks - 1) * 16 + 1 FOR 16)
              || substring(CAST(:tokens AS bytea) FROM h.prompt_blocks * h.block_size * 4 + 1
                           FOR (h.prompt_tokens - h.prompt_blocks * h.block_size)::int * 4)))
)""",
    order="prompt_tokens DESC, common_tokens DESC, expires_at DESC",
    found_by="prompt",
)


def continue_params(q: ClaimQuery) -> dict[str, Any]:
    """CONTINUE_CLAIM_SQL's parameters for a claim without a conversation id, but `actor`: a
    claim's, and the new prompt's keys and token ids."""
    return {**_claim_params(q), "keys": probe_keys(q.chain), "tokens": q.prompt_packed}


@dataclass(frozen=True)
class Candidate:
    """A live lease of the conversation as the claim statement saw it."""

    lease_id: str
    state: LeaseState
    engine_ok: bool
    block_size_ok: bool
    common_tokens: int
    remaining_seconds: float


# The order in which a failed claim's reasons are reported: the one closest to success
# wins, so an operator sees what would have had to change for reuse to happen.
_FAILURE_RANK = {
    ClaimOutcome.ALREADY_CLAIMED: 6,
    ClaimOutcome.EXPIRING: 5,
    ClaimOutcome.BELOW_THRESHOLD: 4,
    ClaimOutcome.ENGINE_INVALID: 3,
    ClaimOutcome.PREFIX_MISMATCH: 2,
    ClaimOutcome.BLOCK_SIZE_MISMATCH: 1,
}


def candidate_failure(c: Candidate, min_tokens: int, min_remaining: float) -> ClaimOutcome:
    """Why this candidate cannot be (or was not) claimed."""
    if not c.block_size_ok:
        return ClaimOutcome.BLOCK_SIZE_MISMATCH
    if c.common_tokens == 0:
        return ClaimOutcome.PREFIX_MISMATCH
    if not c.engine_ok:
        return ClaimOutcome.ENGINE_INVALID
    if c.common_tokens < min_tokens:
        return ClaimOutcome.BELOW_THRESHOLD
    if c.remaining_seconds <= min_remaining:
        return ClaimOutcome.EXPIRING
    return ClaimOutcome.ALREADY_CLAIMED


def explain_no_claim(
    candidates: list[Candidate], min_tokens: int, min_remaining: float
) -> tuple[ClaimOutcome, Candidate | None]:
    """The outcome to report when nothing was claimed, and the candidate it is about."""
    if not candidates:
        return ClaimOutcome.NO_LEASE, None
    scored = [(candidate_failure(c, min_tokens, min_remaining), c) for c in candidates]
    outcome, best = max(scored, key=lambda oc: (_FAILURE_RANK[oc[0]], oc[1].common_tokens))
    return outcome, best


def claim_result(q: ClaimQuery, rows: Sequence[Row]) -> ClaimAnswer:
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
        released = next(iter(by_kind.get("released", ())), None)
        if released is not None:  # nothing live: the newest lease was released early
            return ClaimOutcome.LEASE_RELEASED, released, 0, 0.0
        return outcome, None, 0, 0.0
    lease = next(r for r in by_kind["candidate"] if r["lease_id"] == best.lease_id)
    return outcome, lease, best.common_tokens, best.remaining_seconds


def lost_the_row_lock(result: ClaimAnswer) -> bool:
    """Whether a claim found its lease free but lost the row lock to a concurrent claimer.

    The statement's snapshot predates the winner's commit, so it cannot tell whose claim won.
    When the winner is the same claim id (a caller's retry racing its first attempt), a
    fresh statement finds it as `prior` and answers it; otherwise it reads ALREADY_CLAIMED
    on a lease that is CLAIMED, which is not asked again.
    """
    outcome, lease, _, _ = result
    return outcome is ClaimOutcome.ALREADY_CLAIMED and lease is not None and lease["state"] == "RETAINED"


class ClaimStore:
    """ClaimReuse, ClaimReuseBatch, and the consume or release of CompleteTurn."""

    def __init__(self, pool: TenantPool, fence: EpochFence, actor: str):
        self.pool = pool
        self.fence = fence
        self.actor = actor

    async def claim(self, q: ClaimQuery) -> ClaimAnswer:
        """Claim the best live lease in one statement; returns (outcome, lease, tokens, remaining).

        A claim that lost its lease's row lock looks once more (see `lost_the_row_lock`); one
        refused on a new database epoch, once more after the failover fence
        (statements.EpochFence).
        """

        async def claim() -> ClaimAnswer:
            result = await self._claim(q)
            return await self._claim(q) if lost_the_row_lock(result) else result

        return await self.fence.fenced(claim)

    async def _claim(self, q: ClaimQuery) -> ClaimAnswer:
        if q.conversation_id:
            sql, params = CLAIM_SQL, _claim_params(q)
        else:
            sql, params = CONTINUE_CLAIM_SQL, continue_params(q)
        params = {**params, "actor": self.actor}
        return claim_result(q, await self.pool.fetch_as(q.tenant, sql, params, "ClaimReuse"))

    async def claim_batch(self, queries: Sequence[ClaimQuery]) -> list[ClaimAnswer]:
        """Each claim as `claim` answers it, in order; one statement per round of claims.

        A round holds at most one claim per conversation (CLAIM_BATCH_SQL's rule); a second
        claim on the same conversation goes in the next round, which runs after the first
        committed and so sees its claim (as two calls in a row would). Claims that lost a
        row lock look once more, together. Refused on a new database epoch, the batch runs again
        after the failover fence (a round that already claimed finds its claims as `prior`).
        """

        async def claim_batch() -> list[ClaimAnswer]:
            results = await self._claim_batch(queries)
            again = [n for n, result in enumerate(results) if lost_the_row_lock(result)]
            if again:
                for n, result in zip(again, await self._claim_batch([queries[n] for n in again]), strict=True):
                    results[n] = result
            return results

        return await self.fence.fenced(claim_batch)

    async def _claim_batch(self, queries: Sequence[ClaimQuery]) -> list[ClaimAnswer]:
        results: list[ClaimAnswer | None] = [None] * len(queries)
        # Claims without a conversation id run their own statement each, side by side: two of
        # them may continue the same lease (a fork), and the row lock settles which one wins.
        unnamed = [n for n, q in enumerate(queries) if not q.conversation_id]
        for n, answer in zip(unnamed, await asyncio.gather(*(self._claim(queries[n]) for n in unnamed)), strict=True):
            results[n] = answer
        named = [n for n, q in enumerate(queries) if q.conversation_id]
        for rnd in rounds([(queries[n].tenant, queries[n].conversation_id) for n in named]):
            members = [named[k] for k in rnd]
            batch = [queries[n] for n in members]
            each = [_claim_params(q) for q in batch]
            params: dict[str, Any] = {k: [p[k] for p in each] for k in each[0]}  # a round is never empty
            params.update(i=list(range(len(batch))), actor=self.actor)
            tenants = sorted({q.tenant for q in batch})
            rows = await self.pool.fetch_as(tenants, CLAIM_BATCH_SQL, params, "ClaimReuseBatch")
            per_claim: list[list[Row]] = [[] for _ in batch]
            for row in rows:
                per_claim[row["i"]].append(row)
            for j, n in enumerate(members):
                results[n] = claim_result(batch[j], per_claim[j])
        return [r for r in results if r is not None]

    async def consume_in(self, tx: Transaction, tenant: str, lease_id: str, claim_id: str) -> Row:
        """CLAIMED → CONSUMED for the claim that read it (repeats are no-ops): one statement in
        the caller's transaction (CompleteTurn's), scoped to `tenant` by it."""
        params = {"tenant": tenant, "id": lease_id, "claim_id": claim_id, "actor": self.actor}
        return _consumed(await tx.fetch(CONSUME_SQL, params), lease_id, claim_id)

    async def release_in(self, tx: Transaction, tenant: str, lease_id: str, claim_id: str, reason: str) -> Row:
        """CLAIMED → RETAINED when still live and newest, else the state it should end in; in the
        caller's transaction (CompleteTurn's), scoped to `tenant` by it.

        Raises before changing anything, so a refused release leaves the transaction usable."""
        lease: Row | None = await tx.fetchrow(_LOCKED_LEASE_SQL, {"id": lease_id, "t": tenant})
        if lease is None:
            raise not_found("LEASE_NOT_FOUND", f"lease {lease_id} does not exist for this tenant")
        if lease["state"] != "CLAIMED":
            if await tx.fetchval(_CLAIM_HELD_SQL, {"id": lease_id, "c": claim_id}):
                return lease  # released or ended already: repeating changes nothing
            raise failed_precondition("CLAIM_MISMATCH", f"lease {lease_id} was never held by claim {claim_id!r}")
        if lease["claim_id"] != claim_id:
            raise failed_precondition("CLAIM_MISMATCH", f"lease {lease_id} is held by another claim, not {claim_id!r}")
        target = LeaseState(await tx.fetchval(RELEASE_TARGET_SQL, {"id": lease_id}))
        released = target is LeaseState.RETAINED
        await tx.fetch(
            RELEASE_SQL if released else RELEASE_ENDED_SQL,
            {"id": lease_id, "tenant": tenant, "to_state": target.value,
             "reason": reason if released else f"{reason}:{target.value}",
             "actor": self.actor, "request_id": claim_id, "event_claim_id": claim_id},
        )
        row: Row | None = await tx.fetchrow(LEASE_SQL, {"id": lease_id})
        assert row is not None
        return row


def _consumed(rows: Sequence[Row], lease_id: str, claim_id: str) -> Row:
    """CONSUME_SQL's answer: the lease, or why the claim could not consume it."""
    if not rows:
        raise not_found("LEASE_NOT_FOUND", f"lease {lease_id} does not exist for this tenant")
    lease: Row = rows[0]
    if lease["moved"]:
        return lease
    if lease["claim_id"] != claim_id:
        raise failed_precondition("CLAIM_MISMATCH", f"lease {lease_id} is not held by claim {claim_id!r}")
    if lease["state"] == "CONSUMED":
        return lease
    raise failed_precondition(f"LEASE_{lease['state']}", f"lease {lease_id} is {lease['state']}, not claimed")
