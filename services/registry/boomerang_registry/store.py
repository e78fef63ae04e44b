"""What the registry's stores share: their two connections to Postgres, and batching rounds.

Two paths, each chosen by who may see the rows, not by how hot a statement is:

- `pool` (rawsql.py, plain asyncpg as the row-level-security role): every statement about
  one tenant's leases and events (claims, consume, release, registrations, a conversation's
  trail) and the heartbeat. The hot statements run here and nowhere else.
- `owner` (SQLAlchemy, the table owner, which row-level security does not restrict): the
  rare work across tenants by design (engine registration and invalidation, which end
  leases of every tenant; explaining a refused registration, whose key is global; an
  operator's listing across tenants; the retained-block totals).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from boomerang_registry.fence import EpochFence
from boomerang_registry.rawsql import TenantPool
from boomerang_registry.totals import RetainedTotals

Row = Mapping[Any, Any]  # a result row by column name (an asyncpg Record, or SQLAlchemy's RowMapping)


@dataclass
class Store:
    """The connections and settings every store of the registry works with."""

    owner: AsyncEngine
    pool: TenantPool
    ttl_margin_seconds: float
    actor: str = "registry"
    retained: RetainedTotals = field(default_factory=RetainedTotals)
    fence: EpochFence = field(init=False)  # the failover fence every claim and registration goes through

    def __post_init__(self) -> None:
        self.fence = EpochFence(self.owner, self.actor)


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
