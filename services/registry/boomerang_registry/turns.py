"""CompleteTurn: a turn's claim settled and its retained blocks registered in one transaction.

A turn's end (the claim consumed or given back, the decode engine's blocks registered) is
one item of the group commit (batching.py): the settlements of every queued turn run first,
then all their registrations as REGISTER_BATCH_SQL's rounds, then the one commit. Every state change still
appends its `lease_events` row in the same statement as the change.

A part the registry refuses (the claim's lease already expired or was never this claim's;
the registration's engine is at another generation) raises before it changes anything, so
the transaction stays usable: that part gets its error, the other commits. Repeating a turn
end repeats nothing: a consume or release by the same claim id is a no-op, and a
registration with the same (engine, generation, remote request id) returns its lease.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from boomerang.errors import BoomerangError

from boomerang_registry.claim_store import ClaimStore
from boomerang_registry.domain import RetainedBlocks
from boomerang_registry.rawsql import Transaction, db_span
from boomerang_registry.registrations import Registered, RegistrationStore
from boomerang_registry.store import Row, Store


@dataclass(frozen=True)
class ClaimSettlement:
    """A claimed lease to settle: consumed (`read`) or given back to the conversation."""

    tenant: str
    lease_id: str
    claim_id: str
    read: bool
    reason: str = "PREFILL_DID_NOT_READ"  # the release's audit reason, when not read


@dataclass(frozen=True)
class TurnEnd:
    """One turn's end: either part may be absent (a turn that pulled nothing, or kept nothing)."""

    claim: ClaimSettlement | None = None
    registration: RetainedBlocks | None = None


@dataclass(frozen=True)
class TurnEnded:
    """Each part's outcome (its row, or the error it alone was refused with); None when absent."""

    claim: Row | BoomerangError | None
    registration: Registered | BoomerangError | None


class TurnStore:
    """Settlements and registrations of many turns, committed together."""

    def __init__(self, store: Store, claims: ClaimStore, registrations: RegistrationStore):
        self.store = store
        self.claims = claims
        self.registrations = registrations

    async def commit(self, turns: Sequence[TurnEnd]) -> list[TurnEnded]:
        """Each turn's outcome, in order, all in one transaction.

        An error of the transaction as a whole (a deadlock, a lost connection) is raised and
        nothing of it committed; the caller may repeat every turn of it. Refused on a new
        database epoch (a registration's guard), nothing of it is applied and it runs again
        after the failover fence (fence.py)."""

        async def commit() -> list[TurnEnded]:
            async with self.store.pool.transaction() as tx:
                settled = await self._settle_in(tx, turns)
                regs = [t.registration for t in turns if t.registration is not None]
                registered = iter(await self.registrations.register_in(tx, regs) if regs else ())
            return [
                TurnEnded(s, next(registered) if t.registration is not None else None)
                for t, s in zip(turns, settled, strict=True)
            ]

        return await self.store.fence.fenced(commit)

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
