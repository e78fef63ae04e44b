"""Releases: ending leases nobody will pull, so their decode engine frees the blocks early.

A lease the retention policy or memory pressure gives up on moves `RETAINED → RELEASED` in
one statement (TRANSITION_SQL: the lease locked, re-checked `RETAINED` after the lock,
moved, its event appended) and is marked `release_pending`. A claim racing it locks the
same row: whichever commits first wins, and the other finds the lease no longer
`RETAINED` (a claimed lease is never released under its puller; a released one is never
claimed). The engine's next heartbeat takes the release (statements.HEARTBEAT_SQL) and its
hook frees the blocks through vLLM's own expiry path.

Supersession, expiry, consumption and a claim that ends its lease mark `release_pending` in
their own statements (statements.py, expiry.py). Leases belong to every tenant, so this
runs as the owner.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from boomerang_registry.domain import LeaseState
from boomerang_registry.statements import TRANSITION_SQL
from boomerang_registry.store import Store

# Why the registry released a lease early (the event's reason).
RELEASE_REASONS = frozenset({"RETENTION_POLICY", "MEMORY_PRESSURE", "OPERATOR"})

RELEASE_LEASES_SQL = TRANSITION_SQL.format(
    where="lease_id = ANY(CAST(:ids AS uuid[])) AND state = 'RETAINED'", extra_set=", release_pending = true"
)


class ReleaseStore:
    """Early releases of retained leases."""

    def __init__(self, store: Store):
        self.store = store

    async def release(
        self,
        lease_ids: Sequence[str],
        reason: str,
        request_id: str,
        actor: str = "",
        check: Callable[[AsyncConnection], Awaitable[None]] | None = None,
    ) -> list[str]:
        """Move those of `lease_ids` still RETAINED to RELEASED; the ids moved.

        `check` runs first in the same transaction (ReleaseLeases passes the reaper's fence,
        so a deposed leader's decision never lands)."""
        if reason not in RELEASE_REASONS:
            raise ValueError(f"release reason {reason!r} is not one of {sorted(RELEASE_REASONS)}")
        if not lease_ids:
            return []
        async with self.store.owner.begin() as conn:
            if check is not None:
                await check(conn)
            rows = await conn.execute(
                text(RELEASE_LEASES_SQL),
                {"ids": list(lease_ids), "to_state": LeaseState.RELEASED.value, "reason": reason,
                 "actor": actor or self.store.actor, "request_id": request_id, "event_claim_id": ""},
            )
            return [r.lease_id for r in rows]
