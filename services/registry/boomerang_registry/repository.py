"""The registry's data layer: one store per concern over the two connections of store.py.

- `engines` (engine_store.py): RegisterEngine, Heartbeat, InvalidateEngine, ListEngines.
- `registrations` (registrations.py): RegisterRetainedBlocks, alone or group-committed.
- `claims` (claim_store.py): ClaimReuse (one or a batch), and CompleteTurn's consume or release.
- `turns` (turns.py): CompleteTurn, a claim settled and a registration in one transaction.
- `events` (events.py): GetConversation, ListLeases.
- `releases` (release_store.py): early releases of retained leases (retention policy, memory).
- `fence` (fence.py): the failover fence every claim and registration goes through.

Each public method is one transaction, and every lease state change in it appends its
`lease_events` row in the same statement. Expiry is always decided against the database's
`now()`. The hot statements (statements.py) run on the asyncpg pool only, in tests as in
production.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from boomerang_registry.claim_store import ClaimStore
from boomerang_registry.engine_store import EngineStore
from boomerang_registry.events import EventStore
from boomerang_registry.fence import EpochFence
from boomerang_registry.rawsql import TenantPool
from boomerang_registry.registrations import RegistrationStore
from boomerang_registry.release_store import ReleaseStore
from boomerang_registry.store import Store
from boomerang_registry.totals import RetainedTotals
from boomerang_registry.turns import TurnStore


class RegistryRepository:
    """Postgres access for the registry, by concern."""

    def __init__(self, owner: AsyncEngine, pool: TenantPool, ttl_margin_seconds: float, actor: str = "registry"):
        store = Store(owner, pool, ttl_margin_seconds, actor)
        self.owner: AsyncEngine = owner
        self.pool: TenantPool = pool
        self.retained: RetainedTotals = store.retained
        self.fence: EpochFence = store.fence
        self.engines = EngineStore(store)
        self.registrations = RegistrationStore(store)
        self.claims = ClaimStore(store)
        self.turns = TurnStore(store, self.claims, self.registrations)
        self.events = EventStore(store)
        self.releases = ReleaseStore(store)
