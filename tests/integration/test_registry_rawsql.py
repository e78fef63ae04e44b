"""The registry's asyncpg pool (claim_store.TenantPool): named parameters, and the group
commit on it.

The repository's own tests (test_registry_repository.py) already run every hot statement
on this pool, as the service does; there is no second path to compare it with.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest
from boomerang.errors import BoomerangError
from boomerang_registry import wire
from boomerang_registry.claim_store import positional
from boomerang_registry.group_commit import RegistrationBatcher
from boomerang_registry.repository import RegistryRepository
from boomerang_server.leases import ClaimOutcome

from tests.support.registry_data import blocks_request, claim_request, engine_request
from tests.support.registry_repo import open_repository

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def repo(database_url: str) -> AsyncIterator[RegistryRepository]:
    async with open_repository(database_url, size=20) as opened:
        yield opened


def test_named_parameters_become_positional_and_casts_stay() -> None:
    sql, names = positional("SELECT :a, CAST(:b AS uuid), x::text, :a WHERE y = :b_2 AND z::int > 0")
    assert sql == "SELECT $1, CAST($2 AS uuid), x::text, $1 WHERE y = $3 AND z::int > 0"
    assert names == ["a", "b", "b_2"]


async def test_group_commit_on_the_raw_pool(repo: RegistryRepository, pg: asyncpg.Connection, unique: str) -> None:
    batcher = RegistrationBatcher(repo.turns, max_batch=64, workers=1)
    batcher.start()
    eid = f"raw-{unique}"
    try:
        await repo.engines.register(wire.engine_spec(engine_request(eid, generation=2), 480), "r")
        tokens = list(range(80))
        good = [wire.retained_blocks(blocks_request(f"t{i % 3}-{unique}", f"c{i}", eid, tokens, generation=2),
                                         10**6, 10**7) for i in range(60)]
        stale = wire.retained_blocks(blocks_request(f"t0-{unique}", "stale", eid, tokens, generation=1), 10**6, 10**7)
        first = await asyncio.gather(*(batcher.register(r) for r in [*good[:30], stale, *good[30:]]),
                                     return_exceptions=True)
        again = await asyncio.gather(*(batcher.register(r) for r in good[:5]))
    finally:
        await batcher.stop()
    errors = [r for r in first if isinstance(r, BaseException)]
    assert len(errors) == 1 and isinstance(errors[0], BoomerangError) and errors[0].reason == "STALE_GENERATION"
    assert max(batcher.batch_sizes) > 1
    created = [r for r in first if not isinstance(r, BaseException)]
    assert all(c for _, c, _ in created) and len({row["lease_id"] for row, _, _ in created}) == 60
    row = created[0][0]
    assert row["state"] == "RETAINED" and row["block_ids"] == [list(range(100, 105))] and row["num_tokens"] == 80
    # Repeats are idempotent and answer the stored lease.
    assert [c for _, c, _ in again] == [False] * 5
    assert {r["lease_id"] for r, _, _ in again} == {r["lease_id"] for r, _, _ in created[:5]}
    assert await pg.fetchval("SELECT count(*) FROM leases WHERE engine_id = $1", eid) == 60
    assert await pg.fetchval(
        "SELECT count(*) FROM lease_events e JOIN leases l USING (lease_id) WHERE l.engine_id = $1 "
        "AND e.reason = 'REGISTERED'", eid) == 60
    # Each lease landed in its own tenant, and a claim as another tenant finds nothing.
    lease_tenant = await pg.fetchval("SELECT tenant FROM leases WHERE lease_id = $1::uuid", created[1][0]["lease_id"])
    assert lease_tenant == f"t1-{unique}"
    outcome, _, _, _ = await repo.claims.claim(wire.claim(claim_request(f"t2-{unique}", "c1", tokens + [1, 2, 3])))
    assert outcome is ClaimOutcome.NO_LEASE
    outcome, lease, reusable, _ = await repo.claims.claim(wire.claim(claim_request(f"t1-{unique}", "c1", tokens + [1, 2, 3])))
    assert outcome is ClaimOutcome.CLAIMED and lease is not None and reusable == 80
