"""The failover fence's guard on the real Postgres: a stored epoch that is not the server's.

A failover itself is in tests/e2e/test_failover.py (a real primary and standby). Here the
stored epoch is changed by hand, which is what the server's own timeline moving on looks
like to the guard, on a database of the module's own: the fence invalidates every live
lease of the database, so it must not see other tests' leases.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
from boomerang.errors import BoomerangError
from boomerang_registry import wire
from boomerang_registry.repository import RegistryRepository
from boomerang_registry.statements import CLAIM_SQL
from boomerang_registry.wire import ClaimSettlement, TurnEnd
from boomerang_server.leases import ClaimOutcome

from tests.support.databases import fresh_database
from tests.support.registry_data import blocks_request, claim_request, engine_request
from tests.support.registry_repo import open_repository, register_blocks

pytestmark = pytest.mark.integration
TENANT = "t-fence"


@pytest.fixture(scope="module")
def fence_db() -> Iterator[str]:
    with fresh_database("boomerang_fence") as url:
        yield url


@pytest.fixture
async def repo(fence_db: str) -> AsyncIterator[RegistryRepository]:
    # No clock allowance: a turn that finishes after the fence registers at once.
    async with open_repository(fence_db, size=6, ttl_margin_seconds=0.0) as opened:
        yield opened


@pytest.fixture
async def db(fence_db: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(fence_db)
    yield conn
    await conn.close()


def tokens(n: int, start: int = 1000) -> list[int]:
    return list(range(start, start + n))


async def lease_for(repo: RegistryRepository, engine: str, conv: str, finish: float = 0.0) -> str:
    req = blocks_request(TENANT, conv, engine, tokens(320), finish_time_unix=finish)
    lease, created, _ = await register_blocks(repo, wire.retained_blocks(req, 10**6, 10**7))
    assert created
    return str(lease["lease_id"])


async def engine(repo: RegistryRepository) -> str:
    engine_id = f"d-{uuid.uuid4().hex[:8]}"
    await repo.engines.register(wire.engine_spec(engine_request(engine_id), 480), "req")
    return engine_id


async def fence_events(db: asyncpg.Connection, lease_id: str) -> list[tuple[str, str, dict[str, object]]]:
    rows = await db.fetch(
        "SELECT from_state, reason, details FROM lease_events WHERE lease_id = $1 AND to_state = 'INVALIDATED'",
        uuid.UUID(lease_id),
    )
    return [(r["from_state"], r["reason"], json.loads(r["details"])) for r in rows]


async def state(db: asyncpg.Connection, lease_id: str) -> tuple[str, bool]:
    row = await db.fetchrow("SELECT state, release_pending FROM leases WHERE lease_id = $1", uuid.UUID(lease_id))
    return row["state"], row["release_pending"]


async def test_a_stale_epoch_refuses_the_claim_statement_and_changes_nothing(
    repo: RegistryRepository, db: asyncpg.Connection
) -> None:
    eid = await engine(repo)
    conv = f"c-{uuid.uuid4().hex[:8]}"
    lease = await lease_for(repo, eid, conv)
    await db.execute("UPDATE database_epoch SET timeline = timeline + 1")
    q = wire.claim(claim_request(TENANT, conv, tokens(400)))
    params = {"tenant": TENANT, "conversation_id": conv, "claim_id": q.claim_id, "block_size": 16,
              "chain": q.chain.block_hashes, "tail_hash": q.chain.tail_hash, "num_tokens": q.chain.num_tokens,
              "model": "", "min_tokens": 1, "min_remaining": 5.0, "actor": "test"}
    with pytest.raises(asyncpg.PostgresError) as err:
        await repo.pool.fetch_as(TENANT, CLAIM_SQL, params, "ClaimReuse")
    assert err.value.sqlstate == "BX001" and "database epoch changed" in str(err.value)
    assert await state(db, lease) == ("RETAINED", False)
    await repo.fence.ensure()  # leave the database current for the other tests


async def test_concurrent_claims_on_a_new_timeline_fence_once_and_claim_nothing(
    repo: RegistryRepository, fence_db: str, db: asyncpg.Connection
) -> None:
    eid = await engine(repo)
    convs = [f"c-{uuid.uuid4().hex[:8]}" for _ in range(4)]
    retained = [await lease_for(repo, eid, c) for c in convs]
    held = await repo.claims.claim(wire.claim(claim_request(TENANT, convs[0], tokens(400))))
    assert held[0] is ClaimOutcome.CLAIMED
    claimed = retained[0]
    before = await db.fetchrow("SELECT timeline FROM database_epoch")

    # Two registries (two processes' fences) and many claims at once, on every conversation.
    async with open_repository(fence_db, size=4, ttl_margin_seconds=0.0) as other:
        await db.execute("UPDATE database_epoch SET timeline = timeline + 1")
        answers = await asyncio.gather(*(
            r.claims.claim(wire.claim(claim_request(TENANT, c, tokens(400))))
            for r in (repo, other) for c in convs for _ in range(3)
        ))
    assert {a[0] for a in answers} == {ClaimOutcome.NO_LEASE}
    for lease in retained:
        events = await fence_events(db, lease)
        assert len(events) == 1, events  # fenced once, whoever ran the fence
        from_state, reason, details = events[0]
        assert reason == "TIMELINE_CHANGED"
        assert details["from_timeline"] == before["timeline"] + 1 and details["to_timeline"] == before["timeline"]
        # Unclaimed leases are released to their engine now; a claimed one never under its puller.
        assert await state(db, lease) == ("INVALIDATED", lease != claimed)
        assert from_state == ("CLAIMED" if lease == claimed else "RETAINED")
    epoch = await db.fetchrow("SELECT timeline, fenced_at FROM database_epoch")
    assert epoch["timeline"] == before["timeline"] and epoch["fenced_at"] is not None
    # The next turn's lease is claimable again, and fencing again finds nothing to do.
    fresh = await lease_for(repo, eid, convs[1])
    again = await repo.claims.claim(wire.claim(claim_request(TENANT, convs[1], tokens(400))))
    assert again[0] is ClaimOutcome.CLAIMED and again[1] is not None and str(again[1]["lease_id"]) == fresh
    assert await repo.fence.run() is None


async def test_a_turn_end_on_a_new_epoch_is_fenced_first_and_never_half_applied(
    repo: RegistryRepository, db: asyncpg.Connection
) -> None:
    eid = await engine(repo)
    conv = f"c-{uuid.uuid4().hex[:8]}"
    lease = await lease_for(repo, eid, conv)
    q = wire.claim(claim_request(TENANT, conv, tokens(400)))
    assert (await repo.claims.claim(q))[0] is ClaimOutcome.CLAIMED
    finished_before = time.time()
    await db.execute("UPDATE database_epoch SET system_identifier = system_identifier + 1")

    # The consume runs first in the turn's transaction and the registration's guard refuses:
    # nothing of it lands, the fence runs, and the turn end is answered on the fenced data.
    late = wire.retained_blocks(blocks_request(TENANT, conv, eid, tokens(500), finish_time_unix=finished_before),
                                    10**6, 10**7)
    (ended,) = await repo.turns.commit([TurnEnd(ClaimSettlement(TENANT, lease, q.claim_id, read=True), late)])
    assert isinstance(ended.claim, BoomerangError) and ended.claim.reason == "LEASE_INVALIDATED"
    assert isinstance(ended.registration, BoomerangError)
    assert ended.registration.reason == "FINISHED_BEFORE_FAILOVER"
    assert await state(db, lease) == ("INVALIDATED", False)
    ((_, reason, _),) = await fence_events(db, lease)
    assert reason == "SYSTEM_CHANGED"
    assert await db.fetchval("SELECT count(*) FROM lease_events WHERE lease_id = $1 AND to_state = 'CONSUMED'",
                             uuid.UUID(lease)) == 0
    # A turn that finished after the fence registers and is claimable.
    now = wire.retained_blocks(blocks_request(TENANT, conv, eid, tokens(500)), 10**6, 10**7)
    (after,) = await repo.turns.commit([TurnEnd(None, now)])
    assert not isinstance(after.registration, BoomerangError) and after.registration is not None
    assert after.registration[1]  # created


async def test_a_claim_batch_on_a_new_timeline_is_fenced_and_claims_nothing(
    repo: RegistryRepository, db: asyncpg.Connection
) -> None:
    eid = await engine(repo)
    convs = [f"c-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    leases = [await lease_for(repo, eid, c) for c in convs]
    await db.execute("UPDATE database_epoch SET timeline = timeline + 1")
    answers = await repo.claims.claim_batch([wire.claim(claim_request(TENANT, c, tokens(400))) for c in convs])
    assert [a[0] for a in answers] == [ClaimOutcome.NO_LEASE] * 3
    for lease in leases:
        assert await state(db, lease) == ("INVALIDATED", True)
        assert [e[1] for e in await fence_events(db, lease)] == ["TIMELINE_CHANGED"]
