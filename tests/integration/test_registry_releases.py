"""Releases against the real Postgres: what ends a lease nobody will pull tells its decode
engine (in the heartbeat's answer, once), a claimed lease is never released, and a claim
racing a release has exactly one winner."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from boomerang_registry import wire
from boomerang_registry.expiry import ExpiryRepository
from boomerang_registry.repository import RegistryRepository
from boomerang_server.leases import ClaimOutcome

from tests.support.registry_data import blocks_request, claim_request, engine_request
from tests.support.registry_repo import open_repository, register_blocks, settle

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def repo(database_url: str) -> AsyncIterator[RegistryRepository]:
    async with open_repository(database_url, size=20) as opened:
        yield opened


async def engine(repo: RegistryRepository, engine_id: str, generation: int = 1) -> None:
    await repo.engines.register(wire.engine_spec(engine_request(engine_id, generation), 480), "req")


async def register(repo: RegistryRepository, tenant: str, conv: str, engine_id: str, tokens: list[int], rid: str,
                   generation: int = 1):  # type: ignore[no-untyped-def]
    req = blocks_request(tenant, conv, engine_id, tokens, request_id=rid, generation=generation)
    row, _, superseded = await register_blocks(repo, wire.retained_blocks(req, 10**6, 10**7))
    return row, superseded


async def claim(repo: RegistryRepository, tenant: str, conv: str, tokens: list[int]):  # type: ignore[no-untyped-def]
    return await repo.claims.claim(wire.claim(claim_request(tenant, conv, tokens)))


async def take(repo: RegistryRepository, engine_id: str, generation: int = 1) -> list[tuple[str, str]]:
    _, released = await repo.engines.heartbeat(engine_id, generation, 0, 0, take_releases=True)
    return [(r.remote_request_id, r.state) for r in released]


def tokens(n: int, seed: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 50_000 for i in range(n)]


async def test_superseded_lease_reaches_its_engine_once(repo: RegistryRepository, unique: str) -> None:
    d1, d2 = f"d1-{unique}", f"d2-{unique}"
    await engine(repo, d1)
    await engine(repo, d2)
    first = tokens(200, 1)
    started = time.monotonic()
    await register(repo, "t", unique, d1, first, f"r1-{unique}")
    _, superseded = await register(repo, "t", unique, d2, first + tokens(100, 2), f"r2-{unique}")
    assert superseded == 1
    # A service heartbeating on d1's behalf (the router vouching) leaves the release for d1.
    _, vouched = await repo.engines.heartbeat(d1, 1, 0, 0)
    assert vouched == []
    assert await take(repo, d1) == [(f"r1-{unique}", "SUPERSEDED")]
    assert time.monotonic() - started < 1.0  # superseded → told, in one heartbeat
    assert await take(repo, d1) == []  # handed out once
    assert await take(repo, d2) == []  # the new turn is live


async def test_heartbeat_records_free_blocks(repo: RegistryRepository, unique: str) -> None:
    d = f"d-{unique}"
    await engine(repo, d)
    row, _ = await repo.engines.heartbeat(d, 1, 0, 0, free_blocks=300, total_blocks=1000)
    assert (row["free_kv_blocks"], row["total_kv_blocks"]) == (300, 1000)


async def test_claimed_lease_is_never_released(repo: RegistryRepository, pg: asyncpg.Connection, unique: str) -> None:
    d = f"d-{unique}"
    await engine(repo, d)
    prompt = tokens(300, 3)
    lease, _ = await register(repo, "t", unique, d, prompt, f"r-{unique}")
    outcome, claimed, _, _ = await claim(repo, "t", unique, prompt + [1, 2, 3])
    assert outcome is ClaimOutcome.CLAIMED and claimed is not None
    assert await ExpiryRepository(repo.owner).release([lease["lease_id"]], "RETENTION_POLICY", "policy") == []
    assert await pg.fetchval("SELECT state FROM leases WHERE lease_id = $1", uuid.UUID(lease["lease_id"])) == "CLAIMED"
    # Superseding skips it too: its puller may be reading.
    await register(repo, "t", unique, d, prompt + tokens(50, 4), f"r2-{unique}")
    assert await take(repo, d) == []
    # Read and reported: consumed, and released as a backstop to P's read notice.
    await settle(repo, "t", lease["lease_id"], claimed["claim_id"], read=True)
    assert await take(repo, d) == [(f"r-{unique}", "CONSUMED")]


async def test_policy_release_and_its_event(repo: RegistryRepository, pg: asyncpg.Connection, unique: str) -> None:
    d = f"d-{unique}"
    await engine(repo, d)
    prompt = tokens(300, 5)
    lease, _ = await register(repo, "t", unique, d, prompt, f"r-{unique}")
    assert await ExpiryRepository(repo.owner).release([lease["lease_id"]], "RETENTION_POLICY", "policy") == [lease["lease_id"]]
    events = await pg.fetch("SELECT from_state, to_state, reason FROM lease_events WHERE lease_id = $1 ORDER BY event_id",
                            uuid.UUID(lease["lease_id"]))
    assert [tuple(e) for e in events][-1] == ("RETAINED", "RELEASED", "RETENTION_POLICY")
    outcome, found, _, _ = await claim(repo, "t", unique, prompt + [7])
    assert outcome is ClaimOutcome.LEASE_RELEASED  # reuse lost to an early release, said so
    assert found is not None and found["lease_id"] == lease["lease_id"] and found["state"] == "RELEASED"
    assert await take(repo, d) == [(f"r-{unique}", "RELEASED")]
    with pytest.raises(ValueError):
        await ExpiryRepository(repo.owner).release([lease["lease_id"]], "BECAUSE", "x")


async def test_older_generations_releases_are_dropped(repo: RegistryRepository, unique: str) -> None:
    d = f"d-{unique}"
    await engine(repo, d)
    lease, _ = await register(repo, "t", unique, d, tokens(100, 6), f"r-{unique}")
    await ExpiryRepository(repo.owner).release([lease["lease_id"]], "OPERATOR", "x")
    await engine(repo, d, generation=2)  # a new process holds none of the old blocks
    assert await take(repo, d, generation=2) == []


async def test_claim_racing_release_has_one_winner(repo: RegistryRepository, pg: asyncpg.Connection, unique: str) -> None:
    d = f"d-{unique}"
    await engine(repo, d)
    wins = {"claim": 0, "release": 0}
    for n in range(40):
        conv = f"{unique}-{n}"
        prompt = tokens(200, n)
        lease, _ = await register(repo, "t", conv, d, prompt, f"r-{unique}-{n}")
        (outcome, claimed, _, _), released = await asyncio.gather(
            claim(repo, "t", conv, prompt + [9]),
            ExpiryRepository(repo.owner).release([lease["lease_id"]], "MEMORY_PRESSURE", f"race-{n}"),
        )
        state = await pg.fetchval("SELECT state FROM leases WHERE lease_id = $1", uuid.UUID(lease["lease_id"]))
        if outcome is ClaimOutcome.CLAIMED:
            assert released == [] and state == "CLAIMED" and claimed is not None
            wins["claim"] += 1
        else:
            assert released == [lease["lease_id"]] and state == "RELEASED"
            assert outcome is ClaimOutcome.LEASE_RELEASED
            wins["release"] += 1
    assert sum(wins.values()) == 40
    taken = await take(repo, d)
    assert len(taken) == wins["release"] and all(state == "RELEASED" for _, state in taken)


async def test_released_is_the_decline_only_while_nothing_newer(repo: RegistryRepository, unique: str) -> None:
    """LEASE_RELEASED names a released newest lease; a newer turn, or another conversation, is not it."""
    d = f"d-{unique}"
    await engine(repo, d)
    prompt = tokens(300, 8)
    lease, _ = await register(repo, "t", unique, d, prompt, f"r-{unique}")
    await ExpiryRepository(repo.owner).release([lease["lease_id"]], "MEMORY_PRESSURE", "pressure")
    assert (await claim(repo, "t", f"{unique}-other", prompt + [1]))[0] is ClaimOutcome.NO_LEASE
    batch = await repo.claims.claim_batch([wire.claim(claim_request("t", unique, prompt + [1])),
                                           wire.claim(claim_request("t", f"{unique}-x", prompt + [1]))])
    assert [b[0] for b in batch] == [ClaimOutcome.LEASE_RELEASED, ClaimOutcome.NO_LEASE]
    # The next turn, computed afresh, is retained again: its own lease is claimed, not the release reported.
    longer = prompt + tokens(100, 9)
    await register(repo, "t", unique, d, longer, f"r2-{unique}")
    assert (await claim(repo, "t", unique, longer + [1]))[0] is ClaimOutcome.CLAIMED

