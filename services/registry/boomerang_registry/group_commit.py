"""RegisterRetainedBlocks and CompleteTurn: registrations and turn ends, group-committed.

A turn's end (the claim consumed or given back, the decode engine's blocks registered) is
one item of the group commit; a registration alone is a turn end without a claim. A
registration's cost is dominated by its commit (a WAL flush). Handlers put their turn end
in a queue and wait; a few workers (`RegistrationBatcher`) each take everything queued (up
to `max_batch`), run them in one transaction and commit once, then answer every waiting
handler. Nothing is acknowledged before its commit. In the transaction (`TurnStore.commit`)
the settlements of every queued turn run first, then all their registrations as
REGISTER_BATCH_SQL's rounds on the hot-path pool. Every state change still appends its
`lease_events` row in the same statement as the change.

A part the registry refuses (the claim's lease already expired or was never this claim's;
the registration's engine is at another generation) raises before it changes anything, so
the transaction stays usable: that part gets its error, the other commits. If the batch
transaction fails as a whole (a deadlock with another replica, a lost connection), each
turn end is retried alone, so one bad apple never fails its neighbours. Repeating a turn
end repeats nothing: a consume or release by the same claim id is a no-op, and a
registration with the same (engine, generation, remote request id) returns its lease. A
registration that inserts nothing (a repeat, or one its engine refuses) is explained on the
owner's connection, since its key is global across tenants.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from boomerang.errors import BoomerangError, Code, failed_precondition
from boomerang.tokenchain import prompt_key, prompt_tail_digest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from boomerang_registry.claim_store import ClaimStore, Row, TenantPool, Transaction, db_span, rounds
from boomerang_registry.engine_store import engine_row
from boomerang_registry.metrics import BATCH_SIZE
from boomerang_registry.statements import (
    FINISHED_AFTER_FENCE,
    LEASE_COLUMNS,
    REGISTER_BATCH_SQL,
    EpochFence,
)
from boomerang_registry.wire import RetainedBlocks, TurnEnd

log = logging.getLogger(__name__)
Registered = tuple[Row, bool, int]  # (lease, created, how many leases it superseded)

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


@dataclass(frozen=True)
class TurnEnded:
    """Each part's outcome (its row, or the error it alone was refused with); None when absent."""

    claim: Row | BoomerangError | None
    registration: Registered | BoomerangError | None


class TurnStore:
    """Settlements and registrations of many turns, committed together."""

    def __init__(
        self, owner: AsyncEngine, pool: TenantPool, fence: EpochFence, claims: ClaimStore,
        ttl_margin_seconds: float, actor: str,
    ):
        self.owner = owner
        self.pool = pool
        self.fence = fence
        self.claims = claims
        self.ttl_margin_seconds = ttl_margin_seconds
        self.actor = actor

    async def commit(self, turns: Sequence[TurnEnd]) -> list[TurnEnded]:
        """Each turn's outcome, in order, all in one transaction.

        An error of the transaction as a whole (a deadlock, a lost connection) is raised and
        nothing of it committed; the caller may repeat every turn of it. Refused on a new
        database epoch (a registration's guard), nothing of it is applied and it runs again
        after the failover fence (statements.EpochFence)."""

        async def commit() -> list[TurnEnded]:
            async with self.pool.transaction() as tx:
                settled = await self._settle_in(tx, turns)
                regs = [t.registration for t in turns if t.registration is not None]
                registered = iter(await self._register_in(tx, regs) if regs else ())
            return [
                TurnEnded(s, next(registered) if t.registration is not None else None)
                for t, s in zip(turns, settled, strict=True)
            ]

        return await self.fence.fenced(commit)

    async def _settle_in(self, tx: Transaction, turns: Sequence[TurnEnd]) -> list[Row | BoomerangError | None]:
        """Each claim settled in turn order (one statement per consume; a release locks and
        checks first). A lease is settled before the same conversation's new lease is
        registered, as the two calls in a row did."""
        claims = [t.claim for t in turns if t.claim is not None]
        if claims:
            await tx.as_tenants(sorted({c.tenant for c in claims}))
        out: list[Row | BoomerangError | None] = []
        for t in turns:
            c = t.claim
            if c is None:
                out.append(None)
                continue
            try:
                with db_span("ConsumeClaim" if c.read else "ReleaseClaim"):
                    if c.read:
                        out.append(await self.claims.consume_in(tx, c.tenant, c.lease_id, c.claim_id))
                    else:
                        out.append(await self.claims.release_in(tx, c.tenant, c.lease_id, c.claim_id, c.reason))
            except BoomerangError as err:
                out.append(err)
        return out

    async def _register_in(self, tx: Transaction, reqs: Sequence[RetainedBlocks]) -> list[Registered | BoomerangError]:
        """Each registration's outcome, in order, in the caller's transaction: a refused one
        writes nothing and gets its error.

        One REGISTER_BATCH_SQL per round (a round holds at most one registration per
        conversation; later ones on the same conversation go in later rounds, so they
        supersede the earlier, in order)."""
        out: list[Registered | BoomerangError | None] = [None] * len(reqs)
        for members in rounds([_round_key(n, r) for n, r in enumerate(reqs)]):
            batch = [reqs[n] for n in members]
            each = [_params(r) for r in batch]
            params: dict[str, Any] = {k: [p[k] for p in each] for k in each[0]}  # a round is never empty
            params.update(i=list(range(len(batch))), margin=self.ttl_margin_seconds, actor=self.actor)
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
        async with self.owner.connect() as conn:
            existing = (
                await conn.execute(
                    text(_BY_REQUEST_SQL), {"e": req.engine_id, "g": req.engine_generation, "r": req.remote_request_id}
                )
            ).first()
            engine = None if existing is not None else await engine_row(conn, req.engine_id)
            fenced_at = None if existing is not None else (
                await conn.execute(
                    text(_BEFORE_FENCE_SQL), {"f": req.finish_time, "margin": self.ttl_margin_seconds}
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


@dataclass
class _Pending:
    turn: TurnEnd
    future: asyncio.Future[TurnEnded] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class RegistrationBatcher:
    """Batches registrations and turn ends (`TurnStore.commit`) into shared transactions."""

    def __init__(self, turns: TurnStore, max_batch: int = 256, workers: int = 2):
        self.turns = turns
        self.max_batch = max_batch
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self.workers = workers
        self.tasks: list[asyncio.Task[None]] = []
        self.batch_sizes: list[int] = []  # recent sizes, for metrics and tests

    def start(self) -> None:
        """Start the workers on the running loop."""
        self.tasks = [asyncio.create_task(self._work(), name=f"group-commit-{i}") for i in range(self.workers)]

    async def stop(self) -> None:
        """Finish what is queued, then stop the workers."""
        await self.queue.join()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def register(self, request: RetainedBlocks) -> Registered:
        """Register through the next batch; returns after the batch committed."""
        outcome = (await self.end_turn(TurnEnd(registration=request))).registration
        if isinstance(outcome, BoomerangError):
            raise outcome
        assert outcome is not None
        return outcome

    async def end_turn(self, turn: TurnEnd) -> TurnEnded:
        """Settle and register a turn's end through the next batch; returns after its commit."""
        pending = _Pending(turn)
        await self.queue.put(pending)
        return await pending.future

    async def _work(self) -> None:
        while True:
            batch = [await self.queue.get()]
            while len(batch) < self.max_batch and not self.queue.empty():
                batch.append(self.queue.get_nowait())
            try:
                await self._commit(batch)
            finally:
                for _ in batch:
                    self.queue.task_done()

    async def _commit(self, batch: list[_Pending]) -> None:
        self.batch_sizes = (self.batch_sizes + [len(batch)])[-1000:]
        BATCH_SIZE.observe(len(batch))
        try:
            # One multi-row statement for the batch (more only where one conversation
            # registers twice in it), then the one commit.
            outcomes = await self.turns.commit([item.turn for item in batch])
        except Exception:
            log.warning("group commit of %d turn ends failed; retrying one by one", len(batch), exc_info=True)
            await asyncio.gather(*(self._alone(item) for item in batch))
            return
        for item, outcome in zip(batch, outcomes, strict=True):
            _settle(item.future, outcome)

    async def _alone(self, item: _Pending) -> None:
        try:
            (outcome,) = await self.turns.commit([item.turn])
            _settle(item.future, outcome)
        except Exception as exc:  # noqa: BLE001 - handed to the waiting RPC to translate
            if not item.future.done():
                item.future.set_exception(exc)


def _settle(future: asyncio.Future[Any], outcome: TurnEnded) -> None:
    if not future.done():
        future.set_result(outcome)
