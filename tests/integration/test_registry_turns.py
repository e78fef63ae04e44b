"""CompleteTurn against the real Postgres: a claim settled and the next lease registered in
one transaction, idempotent, each part refused on its own."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from boomerang.errors import BoomerangError, Code
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang_registry import wire
from boomerang_registry.group_commit import RegistrationBatcher, TurnEnded
from boomerang_registry.repository import RegistryRepository

from tests.support.registry_data import blocks_request, claim_request, engine_request
from tests.support.registry_repo import open_repository, register_blocks

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def repo(database_url: str) -> AsyncIterator[RegistryRepository]:
    async with open_repository(database_url, size=8) as opened:
        yield opened


def tokens(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(n)]


async def events(pg: asyncpg.Connection, lease_id: str) -> list[tuple[str | None, str, str]]:
    rows = await pg.fetch(
        "SELECT from_state, to_state, reason FROM lease_events WHERE lease_id = $1 ORDER BY event_id", uuid.UUID(lease_id)
    )
    return [(r["from_state"], r["to_state"], r["reason"]) for r in rows]


async def claimed_turn(repo: RegistryRepository, tenant: str, conv: str, eid: str, held: list[int], claim_id: str) -> str:
    """Register `held` on `eid` and claim it with a longer prompt; the lease id."""
    await repo.engines.register(wire.engine_spec(engine_request(eid), 480), "r")
    lease, _, _ = await register_blocks(repo, wire.retained_blocks(blocks_request(tenant, conv, eid, held), 10**6, 10**7))
    req = claim_request(tenant, conv, held + [1], claim_id=claim_id)
    outcome, row, _, _ = await repo.claims.claim(wire.claim(req))
    assert row is not None and row["lease_id"] == lease["lease_id"], outcome
    return str(lease["lease_id"])


def complete(tenant: str, lease_id: str, claim_id: str, registration: rpb.RegisterRetainedBlocksRequest | None,
             use: int = rpb.CLAIM_USE_READ) -> rpb.CompleteTurnRequest:
    req = rpb.CompleteTurnRequest(tenant=tenant, claim=rpb.TurnClaim(lease_id=lease_id, claim_id=claim_id, use=use))
    if registration is not None:
        registration.tenant = ""  # CompleteTurn's tenant stands for it
        req.registration.CopyFrom(registration)
    return req


async def end(repo: RegistryRepository, req: rpb.CompleteTurnRequest) -> TurnEnded:
    (ended,) = await repo.turns.commit([wire.turn_end(req, 10**6, 10**7)])
    return ended


async def test_a_turn_end_consumes_the_claim_and_registers_the_next_lease_once(
    repo: RegistryRepository, pg: asyncpg.Connection, unique: str
) -> None:
    eid, held = f"d-{unique}", tokens(300)
    old = await claimed_turn(repo, "t", unique, eid, held, "c1")
    req = complete("t", old, "c1", blocks_request("t", unique, eid, held + tokens(40, 1), request_id="turn-2"))
    first = await end(repo, req)
    assert not isinstance(first.claim, BoomerangError) and first.claim is not None
    assert first.claim["state"] == "CONSUMED"
    assert not isinstance(first.registration, BoomerangError) and first.registration is not None
    new, created, _ = first.registration
    assert created and new["state"] == "RETAINED" and new["conversation_id"] == unique

    # A lost answer retried: the same leases, nothing moves twice, no event written twice.
    again = await end(repo, req)
    assert not isinstance(again.claim, BoomerangError) and again.claim is not None
    assert (again.claim["state"], again.claim["version"]) == ("CONSUMED", first.claim["version"])
    assert not isinstance(again.registration, BoomerangError) and again.registration is not None
    assert (again.registration[0]["lease_id"], again.registration[1]) == (new["lease_id"], False)
    assert await events(pg, old) == [(None, "RETAINED", "REGISTERED"), ("RETAINED", "CLAIMED", "CLAIMED"),
                                     ("CLAIMED", "CONSUMED", "PREFILL_READ")]
    assert await events(pg, str(new["lease_id"])) == [(None, "RETAINED", "REGISTERED")]


async def test_a_refused_settlement_still_registers_and_a_refused_registration_still_settles(
    repo: RegistryRepository, unique: str
) -> None:
    eid, held = f"d-{unique}", tokens(300)
    old = await claimed_turn(repo, "t", unique, eid, held, "c1")
    wrong_claim = await end(repo, complete("t", old, "someone-else", blocks_request("t", unique, eid, held + [7])))
    assert isinstance(wrong_claim.claim, BoomerangError)
    assert (wrong_claim.claim.code, wrong_claim.claim.reason) == (Code.FAILED_PRECONDITION, "CLAIM_MISMATCH")
    assert not isinstance(wrong_claim.registration, BoomerangError) and wrong_claim.registration is not None
    assert wrong_claim.registration[1]

    stale = await end(repo, complete("t", old, "c1", blocks_request("t", unique, eid, held + [8], generation=0)))
    assert not isinstance(stale.claim, BoomerangError) and stale.claim is not None
    assert stale.claim["state"] == "CONSUMED"
    assert isinstance(stale.registration, BoomerangError) and stale.registration.reason == "STALE_GENERATION"


async def test_a_handle_never_read_goes_back_before_the_next_lease_supersedes_it(
    repo: RegistryRepository, pg: asyncpg.Connection, unique: str
) -> None:
    eid, held = f"d-{unique}", tokens(300)
    old = await claimed_turn(repo, "t", unique, eid, held, "c1")
    ended = await end(repo, complete("t", old, "c1", blocks_request("t", unique, eid, held + [9]), rpb.CLAIM_USE_NOT_READ))
    assert not isinstance(ended.claim, BoomerangError) and ended.claim is not None
    assert ended.claim["state"] == "RETAINED"  # as the release left it, inside the transaction
    assert not isinstance(ended.registration, BoomerangError) and ended.registration is not None
    assert ended.registration[2] == 1  # the released lease, superseded by the new one
    assert [e[1] for e in await events(pg, old)] == ["RETAINED", "CLAIMED", "RETAINED", "SUPERSEDED"]


async def test_concurrent_turn_ends_share_the_group_commit(repo: RegistryRepository, unique: str) -> None:
    batcher = RegistrationBatcher(repo.turns, max_batch=64, workers=1)
    batcher.start()
    try:
        eid, turns = f"d-{unique}", []
        for i in range(20):
            held = tokens(200, i)
            old = await claimed_turn(repo, "t", f"{unique}-{i}", eid, held, f"c{i}")
            reg = blocks_request("t", f"{unique}-{i}", eid, held + [i])
            turns.append(wire.turn_end(complete("t", old, f"c{i}", reg), 10**6, 10**7))
        before = len(batcher.batch_sizes)
        ended = await asyncio.gather(*(batcher.end_turn(t) for t in turns))
    finally:
        await batcher.stop()
    assert all(not isinstance(e.claim, BoomerangError) and e.claim is not None and e.claim["state"] == "CONSUMED" for e in ended)
    assert all(not isinstance(e.registration, BoomerangError) and e.registration is not None and e.registration[1] for e in ended)
    assert len(batcher.batch_sizes) - before < 20  # shared transactions, not one each


def test_a_turn_end_is_validated_field_by_field() -> None:
    bad = rpb.CompleteTurnRequest(
        tenant="t",
        claim=rpb.TurnClaim(lease_id="not-a-uuid", claim_id="", use=rpb.CLAIM_USE_UNSPECIFIED),
        registration=rpb.RegisterRetainedBlocksRequest(tenant="other", engine_id="d"),
    )
    with pytest.raises(BoomerangError) as err:
        wire.turn_end(bad, 10**6, 10**7)
    fields = {v.field for v in err.value.violations}
    assert err.value.code is Code.INVALID_ARGUMENT
    assert {"claim.lease_id", "claim.claim_id", "claim.use", "registration.tenant", "registration.remote_request_id",
            "registration.block_groups"} <= fields
    with pytest.raises(BoomerangError) as err:
        wire.turn_end(rpb.CompleteTurnRequest(tenant="t"), 10**6, 10**7)
    assert [v.field for v in err.value.violations] == ["claim"]
