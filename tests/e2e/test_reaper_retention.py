"""The retention policy live: `boomerang reaper` releases retained turns through the registry.

A registry and one reaper run as processes on a database of this module's own, the reaper
releasing every 0.3 s with tenant policies `quick=p50` (learned from three pauses) and
`vip=off`, tenant `slow` at `ttl`, and memory pressure below a free half of an engine's KV
blocks. The pauses are made the way traffic makes them: a turn registered as finished two
seconds ago and claimed now.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang_reaper.registry_client import ReaperRegistryClient

from tests.support.databases import fresh_database
from tests.support.procs import ServiceProcess
from tests.support.registry_data import blocks_request, claim_request, engine_request

pytestmark = pytest.mark.e2e


def tokens(n: int, seed: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 50_000 for i in range(n)]


@pytest.fixture(scope="module")
def db_url() -> Iterator[str]:
    with fresh_database("boomerang_retention_e2e") as url:
        yield url


@pytest.fixture(scope="module")
def stack(db_url: str) -> Iterator[ServiceProcess]:
    registry = ServiceProcess(["registry", "--listen", "127.0.0.1:0"], {"BOOMERANG_DATABASE_URL": db_url}).start()
    reaper = ServiceProcess(
        ["reaper", "--listen", "127.0.0.1:0", "--registry", registry.address, "--replica-id", "retainer"],
        {"BOOMERANG_DATABASE_URL": db_url, "BOOMERANG_DRAIN_DELAY_SECONDS": "0",
         "BOOMERANG_RELEASE_INTERVAL_SECONDS": "0.3", "BOOMERANG_RETENTION_TENANT_POLICIES": "quick=p50,vip=off",
         "BOOMERANG_RETENTION_POLICY": "ttl", "BOOMERANG_RETENTION_MIN_SAMPLES": "3",
         "BOOMERANG_RETENTION_MIN_HOLD_SECONDS": "0", "BOOMERANG_RETENTION_EVIDENCE_SECONDS": "1",
         "BOOMERANG_MEMORY_PRESSURE_FREE_SHARE": "0.5"},
        name="retainer",
    ).start()
    yield registry
    reaper.kill()
    registry.kill()


@pytest.fixture
async def client(stack: ServiceProcess) -> AsyncIterator[RegistryClient]:
    async with RegistryClient(stack.address) as c:
        yield c


async def state(db: asyncpg.Connection, lease_id: str) -> tuple[str, str]:
    """The lease's state and its last event's reason."""
    row = await db.fetchrow(
        "SELECT l.state, (SELECT reason FROM lease_events e WHERE e.lease_id = l.lease_id ORDER BY event_id DESC "
        "LIMIT 1) AS reason FROM leases l WHERE l.lease_id = $1", uuid.UUID(lease_id))
    return row["state"], row["reason"]


async def retain(client: RegistryClient, tenant: str, engine: str, n: int, seed: int, ago: float = 0.0) -> str:
    req = blocks_request(tenant, f"c-{uuid.uuid4().hex[:8]}", engine, tokens(n, seed),
                         finish_time_unix=time.time() - ago if ago else 0.0)
    return (await client.register_retained_blocks(req)).lease.lease_id


async def test_idle_past_policy_released_pressure_takes_least_valuable_claimed_never(
    client: RegistryClient, db_url: str
) -> None:
    d1, d2 = f"d1-{uuid.uuid4().hex[:6]}", f"d2-{uuid.uuid4().hex[:6]}"
    for d in (d1, d2):
        await client.register_engine(engine_request(d))
    # Evidence: three of tenant quick's turns were claimed about two seconds after they ended.
    for seed in range(3):
        conv, prompt = f"e-{seed}-{uuid.uuid4().hex[:6]}", tokens(160, 100 + seed)
        await client.register_retained_blocks(blocks_request("quick", conv, d1, prompt, finish_time_unix=time.time() - 2))
        claimed = await client.claim_reuse(claim_request("quick", conv, prompt + [1]))
        assert claimed.outcome == rpb.CLAIM_OUTCOME_CLAIMED

    idle = await retain(client, "quick", d1, 160, 1)  # p50 of the pauses: held about two seconds
    exempt = await retain(client, "vip", d1, 160, 2, ago=60)  # off: never, however idle
    conv, prompt = "held-" + uuid.uuid4().hex[:6], tokens(160, 3)
    await client.register_retained_blocks(blocks_request("quick", conv, d1, prompt, finish_time_unix=time.time() - 30))
    claimed = await client.claim_reuse(claim_request("quick", conv, prompt + [1]))
    assert claimed.outcome == rpb.CLAIM_OUTCOME_CLAIMED  # a claimed lease, idle well past the policy
    # d2 under pressure: 40 of 100 blocks free, 50 wanted; tenant slow holds to the TTL, so only
    # pressure releases it, the least valuable first: equal value per block, the longest idle.
    stale = await retain(client, "slow", d2, 160, 4, ago=100)  # 10 blocks
    fresh = await retain(client, "slow", d2, 160, 5)
    await client.heartbeat(rpb.HeartbeatRequest(engine_id=d2, registration_generation=1, free_kv_blocks=40,
                                                total_kv_blocks=100))

    db = await asyncpg.connect(db_url)
    try:
        deadline = time.monotonic() + 15
        while (await state(db, idle))[0] == "RETAINED" or (await state(db, stale))[0] == "RETAINED":
            assert time.monotonic() < deadline, "the reaper released nothing"
            await asyncio.sleep(0.1)
        assert await state(db, idle) == ("RELEASED", "RETENTION_POLICY")
        assert await state(db, stale) == ("RELEASED", "MEMORY_PRESSURE")
        await asyncio.sleep(1.0)  # a few more runs change nothing else
        assert (await state(db, fresh))[0] == "RETAINED"  # 10 blocks freed were enough
        assert (await state(db, exempt))[0] == "RETAINED"
        assert (await state(db, claimed.lease.lease_id))[0] == "CLAIMED"
    finally:
        await db.close()
    # D takes the releases in its next heartbeat; the next turn is told why it computes afresh.
    beat = await client.heartbeat(rpb.HeartbeatRequest(engine_id=d2, registration_generation=1, take_releases=True))
    assert [r.lease_id for r in beat.released] == [stale]


async def test_release_leases_is_fenced_and_checks_its_input(stack: ServiceProcess) -> None:
    async with ReaperRegistryClient(stack.address) as reg:
        with pytest.raises(BoomerangClientError) as fenced:
            await reg.release_leases(rpb.ReleaseLeasesRequest(fence=rpb.ReaperFence(term=999), lease_ids=[str(uuid.uuid4())],
                                                              reason="OPERATOR"))
        assert fenced.value.reason == "FENCED"
        with pytest.raises(BoomerangClientError) as bad:
            await reg.release_leases(rpb.ReleaseLeasesRequest(fence=rpb.ReaperFence(term=1), lease_ids=["nope"],
                                                              reason="BECAUSE"))
        assert bad.value.code == "INVALID_ARGUMENT" and "lease_ids[0]" in str(bad.value) and "reason" in str(bad.value)
