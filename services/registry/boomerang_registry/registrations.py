"""RegisterRetainedBlocks: a retained turn becomes a lease, superseding its conversation's older ones.

One path: REGISTER_BATCH_SQL on the hot-path pool, for the group commit's batch
(batching.py) and for a registration alone alike. A registration that inserts nothing (a
repeat, or one its engine refuses) is explained on the owner's connection, since its key
(engine, generation, remote request id) is global across tenants.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from boomerang.errors import BoomerangError, Code, failed_precondition
from boomerang.tokenchain import prompt_key, prompt_tail_digest
from sqlalchemy import text

from boomerang_registry.domain import RetainedBlocks
from boomerang_registry.engine_store import engine_row
from boomerang_registry.rawsql import Transaction, db_span
from boomerang_registry.statements import FINISHED_AFTER_FENCE, LEASE_COLUMNS, REGISTER_BATCH_SQL
from boomerang_registry.store import Row, Store, rounds

Registered = tuple[Row, bool, int]  # (lease, created, how many leases it superseded)

# REGISTER_BATCH_SQL's per-registration arrays (from `_params`).
_ARRAYS = (
    "lease_id", "tenant", "conversation_id", "model", "engine_id", "generation", "remote_request_id",
    "block_ids", "num_blocks", "num_tokens", "block_size", "chain", "tail_hash", "remote_host",
    "remote_port", "finished_at", "request_id", "prompt_tokens", "prompt_key", "prompt_tail",
)
# Whether a registration of a turn that finished at :f was refused by the failover fence
# (statements.FINISHED_AFTER_FENCE, with `r.finished_at` as :f).
_BEFORE_FENCE_SQL = (
    "SELECT epoch.fenced_at FROM database_epoch epoch, (SELECT CAST(:f AS timestamptz) AS finished_at) r "
    "WHERE NOT " + FINISHED_AFTER_FENCE
)
_BY_REQUEST_SQL = (
    f"SELECT {LEASE_COLUMNS} FROM leases l WHERE l.engine_id = :e "
    "AND l.engine_generation = :g AND l.remote_request_id = :r"
)


def _params(req: RetainedBlocks) -> dict[str, Any]:
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
        "request_id": req.request_id,
        "prompt_tokens": req.prompt_tokens,
        "prompt_key": prompt_key(req.chain, req.prompt_tokens),
        "prompt_tail": prompt_tail_digest(req.chain, req.prompt_tokens, req.prompt_tail_ids),
    }


def _round_key(n: int, req: RetainedBlocks) -> tuple[str, str]:
    """Registrations of one conversation go in separate rounds; those without one never collide."""
    return (req.tenant, req.conversation_id) if req.conversation_id else (req.tenant, f"\0{n}")


class RegistrationStore:
    """Registrations, one or a batch in one transaction."""

    def __init__(self, store: Store):
        self.store = store

    async def register(self, req: RetainedBlocks) -> Registered:
        """Record a retained turn as a lease (idempotent); returns (lease, created, superseded)."""
        (outcome,) = await self.register_batch([req])
        if isinstance(outcome, BoomerangError):
            raise outcome
        return outcome

    async def register_batch(self, reqs: Sequence[RetainedBlocks]) -> list[Registered | BoomerangError]:
        """Each registration's outcome, in order, all committed together.

        A refused registration writes nothing and gets its error; the rest commit. An error
        of the transaction as a whole (a deadlock, a lost connection) is raised; one refused
        on a new database epoch runs again after the failover fence (fence.py)."""

        async def register() -> list[Registered | BoomerangError]:
            async with self.store.pool.transaction() as tx:
                return await self.register_in(tx, reqs)

        return await self.store.fence.fenced(register)

    async def register_in(self, tx: Transaction, reqs: Sequence[RetainedBlocks]) -> list[Registered | BoomerangError]:
        """`register_batch` inside the caller's transaction (CompleteTurn's, turns.py).

        One REGISTER_BATCH_SQL per round (a round holds at most one registration per
        conversation; later ones on the same conversation go in later rounds, so they
        supersede the earlier, in order)."""
        out: list[Registered | BoomerangError | None] = [None] * len(reqs)
        for members in rounds([_round_key(n, r) for n, r in enumerate(reqs)]):
            batch = [reqs[n] for n in members]
            each = [_params(r) for r in batch]
            params: dict[str, Any] = {k: [p[k] for p in each] for k in _ARRAYS}
            params.update(i=list(range(len(batch))), margin=self.store.ttl_margin_seconds, actor=self.store.actor)
            await tx.as_tenants(sorted({r.tenant for r in batch}))
            with db_span("RegisterRetainedBlocks"):
                rows = await tx.fetch(REGISTER_BATCH_SQL, params)
            found = {row["i"]: row for row in rows}
            for j, n in enumerate(members):
                row = found.get(j)
                if row is not None:
                    out[n] = (row, True, int(row["superseded"]))
                    continue
                try:
                    out[n] = (await self._explain_conflict(batch[j]), False, 0)
                except BoomerangError as err:
                    out[n] = err
        return [o for o in out if o is not None]

    async def _explain_conflict(self, req: RetainedBlocks) -> Row:
        """The stored lease of a repeated registration, or the error that says why none was made."""
        # Across tenants on purpose (owner connection): the natural key is global.
        async with self.store.owner.connect() as conn:
            existing = (
                await conn.execute(
                    text(_BY_REQUEST_SQL), {"e": req.engine_id, "g": req.engine_generation, "r": req.remote_request_id}
                )
            ).first()
            engine = None if existing is not None else await engine_row(conn, req.engine_id)
            fenced_at = None if existing is not None else (
                await conn.execute(
                    text(_BEFORE_FENCE_SQL), {"f": req.finish_time, "margin": self.store.ttl_margin_seconds}
                )
            ).scalar_one_or_none()
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
        if fenced_at is not None:
            raise failed_precondition(
                "FINISHED_BEFORE_FAILOVER",
                f"the turn finished before the database failed over (fenced at {fenced_at.isoformat()}, "
                "less the clock allowance): it may have been pulled already, so it is not registered",
            )
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
