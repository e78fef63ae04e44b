"""WatchLeaseKeys' hub against the real Postgres: the snapshot holds every live lease's keys
(and no ended lease's), and a lease registered after the subscription reaches it at commit."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import asyncpg
import pytest
from boomerang.leasekeys import LeaseSummary, apply, conversation_key, keys_of_leases, lease_keys
from boomerang.tokenchain import build_chain
from boomerang_registry.repository import RegistryRepository
from boomerang_registry.watches import LeaseKeysHub, snapshot_messages

from tests.integration.test_registry_continuations import retain
from tests.integration.test_registry_repository import claim, register, register_engine
from tests.support.registry_data import BLOCK
from tests.support.registry_repo import open_repository

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def repo(database_url: str) -> AsyncIterator[RegistryRepository]:
    async with open_repository(database_url, size=4) as opened:
        yield opened


def hub_for(database_url: str, repo: RegistryRepository) -> LeaseKeysHub:
    return LeaseKeysHub(database_url.replace("postgresql+asyncpg://", "postgresql://", 1), repo.owner, 30.0)


def words(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(n)]


async def test_snapshot_then_additions_at_commit(database_url: str, repo: RegistryRepository, unique: str) -> None:
    tenant, eid = f"t-{unique}", f"d-{unique}"
    await register_engine(repo, eid)
    await register(repo, tenant, "before", eid, words(300, 1))
    hub = hub_for(database_url, repo)
    try:
        sub = await hub.subscribe()
        keys, live = await hub.snapshot()
        summary = LeaseSummary()
        for message in snapshot_messages(keys, live):
            apply(summary, message)
        assert summary.ready and live >= 1
        assert summary.may_have_conversation(tenant, "before")
        assert not summary.may_have_conversation(tenant, "after")
        assert not summary.may_have_conversation(f"other-{unique}", "before")  # keys are per tenant

        await register(repo, tenant, "after", eid, words(300, 2))
        added = await asyncio.wait_for(sub.next(5.0), 6.0)
        assert conversation_key(tenant, "after") in added
        summary.add(added)
        assert summary.may_have_conversation(tenant, "after")
    finally:
        await hub.close()


async def test_a_fresh_snapshot_drops_ended_leases(database_url: str, repo: RegistryRepository, pg: asyncpg.Connection,
                                                   unique: str) -> None:
    tenant, eid = f"t-{unique}", f"d-{unique}"
    await register_engine(repo, eid)
    tokens = words(300, 3)
    await register(repo, tenant, "gone", eid, tokens)
    await pg.execute("UPDATE leases SET state = 'EXPIRED' WHERE tenant = $1", tenant)
    hub = hub_for(database_url, repo)
    try:
        await hub.subscribe()
        keys, _ = await hub.snapshot()
        assert conversation_key(tenant, "gone") not in set(keys)
    finally:
        await hub.close()


async def test_a_claimed_lease_stays_a_maybe(database_url: str, repo: RegistryRepository, unique: str) -> None:
    tenant, eid = f"t-{unique}", f"d-{unique}"
    await register_engine(repo, eid)
    tokens = words(300, 4)
    await register(repo, tenant, "held", eid, tokens)
    await claim(repo, tenant, "held", tokens + words(50, 5))
    hub = hub_for(database_url, repo)
    try:
        await hub.subscribe()
        keys, _ = await hub.snapshot()
        assert conversation_key(tenant, "held") in set(keys)  # a claim given back is pullable again
    finally:
        await hub.close()


async def test_a_prompt_without_id_is_a_maybe_only_when_it_continues_a_live_lease(
    database_url: str, repo: RegistryRepository, unique: str
) -> None:
    tenant, eid = f"t-{unique}", f"d-{unique}"
    await register_engine(repo, eid)
    system = words(1024, 6)
    first, output = system + words(40, 7), words(30, 8)
    await retain(repo, tenant, eid, first, output)
    hub = hub_for(database_url, repo)
    try:
        await hub.subscribe()
        keys, live = await hub.snapshot()
        summary = LeaseSummary()
        for message in snapshot_messages(keys, live):
            apply(summary, message)
        next_turn = first + output + words(60, 9)
        assert summary.may_continue(tenant, build_chain(next_turn, BLOCK))
        # Another conversation sharing only the system prompt is ruled out.
        assert not summary.may_continue(tenant, build_chain(system + words(200, 10), BLOCK))
        assert not summary.may_continue(f"other-{unique}", build_chain(next_turn, BLOCK))
    finally:
        await hub.close()


def test_lease_keys_of_a_lease_without_id_or_prompt_key() -> None:
    assert lease_keys("t", "", None) == []
    assert len(lease_keys("t", "c", 5)) == 2
    rows = [("t", "c", 5), ("t", "", -7), ("u", "c", None), ("t", "", None)]
    assert keys_of_leases(rows) == [k for row in rows for k in lease_keys(*row)]
