"""The registry's data layer: its two connections to Postgres, and one store per concern.

Two paths, each chosen by who may see the rows, not by how hot a statement is:

- `pool` (claim_store.TenantPool, plain asyncpg as the row-level-security role): every
  statement about one tenant's leases and events (claims, consume, release, registrations, a
  conversation's trail) and the heartbeat. The hot statements (statements.py) run here and nowhere else,
  in tests as in production.
- `owner` (SQLAlchemy, the table owner, which row-level security does not restrict): the
  rare work across tenants by design (engine registration and invalidation, which end
  leases of every tenant; explaining a refused registration, whose key is global; an
  operator's listing across tenants; the retained-block totals; the reaper's work, expiry.py).

The stores:

- `engines` (engine_store.py): RegisterEngine, Heartbeat, InvalidateEngine, ListEngines.
- `claims` (claim_store.py): ClaimReuse (one or a batch), and CompleteTurn's consume or release.
- `turns` (group_commit.py): RegisterRetainedBlocks and CompleteTurn, a claim settled and a
  registration in one transaction.
- `events` (events.py): GetConversation, ListLeases, ListRegistrations.
- `fence` (statements.EpochFence): the failover fence every claim and registration goes through.

Each public method is one transaction, and every lease state change in it appends its
`lease_events` row in the same statement. Expiry is always decided against the database's
`now()`.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from boomerang_registry.claim_store import ClaimStore, TenantPool
from boomerang_registry.engine_store import EngineStore, RetainedTotals
from boomerang_registry.events import EventStore
from boomerang_registry.group_commit import TurnStore
from boomerang_registry.statements import EpochFence


class RegistryRepository:
    """Postgres access for the registry, by concern."""

    def __init__(self, owner: AsyncEngine, pool: TenantPool, ttl_margin_seconds: float, actor: str = "registry"):
        self.owner = owner
        self.pool = pool
        self.retained = RetainedTotals(owner)  # per-engine retained blocks, shared with the gauges
        self.fence = EpochFence(owner, actor)
        self.engines = EngineStore(owner, pool, self.retained, actor)
        self.claims = ClaimStore(pool, self.fence, actor)
        self.turns = TurnStore(owner, pool, self.fence, self.claims, ttl_margin_seconds, actor)
        self.events = EventStore(owner, pool)
