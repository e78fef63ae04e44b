"""The registry's repository as the service opens it: the owner engine and the tenant pool."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from boomerang.errors import BoomerangError
from boomerang_registry.claim_store import Row, TenantPool
from boomerang_registry.group_commit import Registered
from boomerang_registry.repository import RegistryRepository
from boomerang_registry.statements import WARM_UP
from boomerang_registry.wire import ClaimSettlement, RetainedBlocks, TurnEnd
from boomerang_server.db import make_engine


@asynccontextmanager
async def open_repository(
    database_url: str, size: int = 4, ttl_margin_seconds: float = 10.0
) -> AsyncIterator[RegistryRepository]:
    """A repository on `size` owner connections and `size` tenant-pool connections (as the
    row-level-security role, warmed up as the service's are); closed on exit."""
    owner = make_engine(database_url, pool_size=size)
    pool = await TenantPool.open(database_url, size, "boomerang_service", warm=WARM_UP)
    try:
        yield RegistryRepository(owner, pool, ttl_margin_seconds)
    finally:
        await pool.close()
        await owner.dispose()


async def settle(repo: RegistryRepository, tenant: str, lease_id: str, claim_id: str, read: bool,
                 reason: str = "PREFILL_DID_NOT_READ") -> Row:
    """A claim settled as CompleteTurn settles it (consumed when `read`, else given back), alone
    in its transaction; its row, or its error raised."""
    (ended,) = await repo.turns.commit([TurnEnd(claim=ClaimSettlement(tenant, lease_id, claim_id, read, reason))])
    if isinstance(ended.claim, BoomerangError):
        raise ended.claim
    assert ended.claim is not None
    return ended.claim


async def register_batch(repo: RegistryRepository, reqs: list[RetainedBlocks]) -> list[Registered | BoomerangError]:
    """Registrations as RegisterRetainedBlocks makes them (turn ends without a claim), all in one
    transaction; each one's (lease, created, superseded), or the error it alone was refused with."""
    out = [ended.registration for ended in await repo.turns.commit([TurnEnd(registration=r) for r in reqs])]
    return [o for o in out if o is not None]


async def register_blocks(repo: RegistryRepository, req: RetainedBlocks) -> Registered:
    """One registration, alone in its transaction: (lease, created, superseded), or its error raised."""
    (outcome,) = await register_batch(repo, [req])
    if isinstance(outcome, BoomerangError):
        raise outcome
    return outcome
