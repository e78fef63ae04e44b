"""A Postgres failover under a real registry: a primary and a streaming standby of the
test's own (tests/support/pgcluster.py), which the registry reaches through one multi-host
URL (`target_session_attrs=read-write`, the standby listed first) and reconnects to by itself.

- Asynchronous replication (issue 32's scenario): turn A's lease reaches the standby, the
  standby's replication is cut, turn B pulls A's lease on the primary alone, the primary dies
  and the standby is promoted. The retry of turn B, planned by a router, must not be given
  A's lease (COLD, NO_LEASE): the fence
  invalidated it with its reason and told D to free it; a late repeat of turn B's
  registration (acknowledged on the lost timeline) is refused.
- Synchronous replication: every acknowledged claim, consume and registration is on the
  promoted standby. The cost of a synchronous commit on loopback is printed.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import asyncpg
import pytest
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient
from boomerang.clients.router import RouterClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import types_pb2 as tpb

from tests.support import pgcluster
from tests.support.pgcluster import ReplicatedPostgres
from tests.support.procs import ServiceProcess
from tests.support.registry_data import blocks_request, claim_request, engine_request
from tests.support.router_stack import running_router

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(not pgcluster.available(), reason=f"no PostgreSQL binaries in {pgcluster.BIN}"),
]
T = TypeVar("T")
TENANT = "t-failover"
CONV = "conv-failover"
ENGINE = "d-failover"
PREFILL = "p-failover"
MODEL = "qwen3-32b"  # engine_request's
TURN_A = list(range(1000, 1320))
TURN_B = [*TURN_A, *range(5000, 5100)]


def cluster(synchronous: bool) -> Iterator[ReplicatedPostgres]:
    replicated = ReplicatedPostgres(synchronous=synchronous).start()
    try:
        yield replicated
    finally:
        replicated.close()


@pytest.fixture
def async_cluster() -> Iterator[ReplicatedPostgres]:
    yield from cluster(synchronous=False)


@pytest.fixture
def sync_cluster() -> Iterator[ReplicatedPostgres]:
    yield from cluster(synchronous=True)


@pytest.fixture
def registry_on() -> Iterator[Callable[[str], ServiceProcess]]:
    started: list[ServiceProcess] = []

    def start(url: str) -> ServiceProcess:
        # It migrates the new cluster through the multi-host URL, as any service start does.
        proc = ServiceProcess(["registry", "--listen", "127.0.0.1:0"], {"BOOMERANG_DATABASE_URL": url})
        started.append(proc)
        return proc.start()

    yield start
    for proc in started:
        proc.kill()
        print(f"registry output:\n{proc.output()}")  # shown when the test fails


async def answered(call: Callable[[], Awaitable[T]], timeout: float = 30.0) -> T:
    """The call's answer once the registry reaches a primary again (UNAVAILABLE until then)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except BoomerangClientError as err:
            if err.code != "UNAVAILABLE" or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.1)


async def turn_a(client: RegistryClient) -> str:
    """Turn A was COLD: D's engine registers and A's retained blocks become a lease (its id)."""
    await client.register_engine(engine_request(ENGINE))
    return str((await client.register_retained_blocks(blocks_request(TENANT, CONV, ENGINE, TURN_A))).lease.lease_id)


async def planned(planner: RouterClient, req: rtpb.PlanTurnRequest, timeout: float = 30.0) -> rtpb.PlanTurnResponse:
    """The router's plan once it is made with the registry's answer (not CONTROL_PLANE_DEGRADED)."""
    deadline = time.monotonic() + timeout
    while True:
        plan = await planner.plan_turn(req)
        if plan.reason != rtpb.PLAN_REASON_CONTROL_PLANE_DEGRADED or time.monotonic() > deadline:
            return plan
        await asyncio.sleep(0.1)


def turn_b_blocks(finished: float = 0.0) -> rpb.RegisterRetainedBlocksRequest:
    """What D retained of turn B (its prompt and answer), finished at `finished` (0: now)."""
    return blocks_request(TENANT, CONV, ENGINE, [*TURN_B, *range(9000, 9030)], finish_time_unix=finished)


async def pull_and_end(client: RegistryClient, a_lease: str, b_reg: rpb.RegisterRetainedBlocksRequest) -> str:
    """Turn B's claim of A's lease, read by P, and its end (consume + registration), acknowledged."""
    claim = claim_request(TENANT, CONV, TURN_B)
    pulled = await client.claim_reuse(claim)
    assert pulled.outcome == rpb.CLAIM_OUTCOME_CLAIMED and pulled.lease.lease_id == a_lease
    ended = await client.complete_turn(rpb.CompleteTurnRequest(
        tenant=TENANT, registration=b_reg,
        claim=rpb.TurnClaim(lease_id=a_lease, claim_id=claim.claim_id, use=rpb.CLAIM_USE_READ),
    ))
    assert ended.claim.error_code == 0 and ended.claim.lease.state == tpb.LEASE_STATE_CONSUMED
    assert ended.registration.error_code == 0 and ended.registration.response.created
    return ended.registration.response.lease.lease_id


def events_of(conversation: rpb.GetConversationResponse, lease_id: str) -> list[tuple[str, str]]:
    return [(tpb.LeaseState.Name(e.to_state), e.reason) for e in conversation.events if e.lease_id == lease_id]


async def test_async_failover_never_hands_out_a_lease_used_on_the_lost_timeline(
    async_cluster: ReplicatedPostgres, registry_on: Callable[[str], ServiceProcess]
) -> None:
    cluster = async_cluster
    registry = registry_on(cluster.url)
    with running_router(cluster.url, registry.address) as router:
        await failover_under(cluster, registry, router)
    assert "database epoch changed" in registry.output()


async def failover_under(cluster: ReplicatedPostgres, registry: ServiceProcess, router: ServiceProcess) -> None:
    async with RegistryClient(registry.address) as client:
        await client.register_engine(engine_request(PREFILL, role=tpb.ENGINE_ROLE_PREFILL))
        a_lease = await turn_a(client)
        cluster.wait_replayed()  # A's lease is on the standby
        cluster.cut_replication()
        b_reg = turn_b_blocks(time.time())
        b_lease = await pull_and_end(client, a_lease, b_reg)  # on the primary alone

        cluster.fail_over()
        # A client's retry of turn B: a new plan through the router, which claims through the
        # registry; both reconnect by themselves (the plan degrades until they have).
        async with RouterClient(router.address) as planner:
            retry = await planned(planner, rtpb.PlanTurnRequest(
                tenant=TENANT, conversation_id=CONV, model=MODEL, prompt_token_ids=TURN_B))
        assert (retry.decision, retry.reason) == (rtpb.PLAN_DECISION_COLD, rtpb.PLAN_REASON_NO_LEASE)
        direct = await client.claim_reuse(claim_request(TENANT, CONV, TURN_B))
        assert direct.outcome == rpb.CLAIM_OUTCOME_NO_LEASE and not direct.lease.lease_id

        conversation = await client.get_conversation(rpb.GetConversationRequest(tenant=TENANT, conversation_id=CONV, include_events=True))
        leases = {lease.lease_id: lease for lease in conversation.leases}
        assert b_lease not in leases  # lost with the old timeline
        assert leases[a_lease].state == tpb.LEASE_STATE_INVALIDATED
        assert events_of(conversation, a_lease) == [
            ("LEASE_STATE_RETAINED", "REGISTERED"), ("LEASE_STATE_INVALIDATED", "TIMELINE_CHANGED")
        ]
        details = json.loads(cluster.standby.sql(
            f"SELECT details FROM lease_events WHERE lease_id = '{a_lease}' AND reason = 'TIMELINE_CHANGED'"))
        assert (details["from_timeline"], details["to_timeline"]) == (1, 2)

        # D is told to free A's blocks through the ordinary release path (its heartbeat's answer).
        beat = await client.heartbeat(rpb.HeartbeatRequest(engine_id=ENGINE, registration_generation=1,
                                                           take_releases=True))
        assert [(r.lease_id, r.state) for r in beat.released] == [(a_lease, tpb.LEASE_STATE_INVALIDATED)]

        # A late repeat of turn B's end (acknowledged on the lost timeline: D freed A's blocks
        # and B's lease may have been pulled there too) registers nothing claimable.
        with pytest.raises(BoomerangClientError) as refused:
            await client.register_retained_blocks(b_reg)
        assert refused.value.code == "FAILED_PRECONDITION" and refused.value.reason == "FINISHED_BEFORE_FAILOVER"
        again = await client.claim_reuse(claim_request(TENANT, CONV, TURN_B))
        assert again.outcome == rpb.CLAIM_OUTCOME_NO_LEASE


async def commit_latency_ms(url: str, mode: str, n: int = 200) -> list[float]:
    """Milliseconds per single-row autocommit INSERT with `synchronous_commit = mode`."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f"SET synchronous_commit = {mode}")
        await conn.execute("CREATE TABLE IF NOT EXISTS commit_probe (n int)")
        took = []
        for i in range(n):
            started = time.perf_counter()
            await conn.execute("INSERT INTO commit_probe VALUES ($1)", i)
            took.append((time.perf_counter() - started) * 1000)
        return took
    finally:
        await conn.close()


async def test_sync_failover_loses_no_acknowledged_write(
    sync_cluster: ReplicatedPostgres, registry_on: Callable[[str], ServiceProcess]
) -> None:
    cluster = sync_cluster
    probe = cluster.primary.url("postgres")
    local, remote = await commit_latency_ms(probe, "local"), await commit_latency_ms(probe, "on")
    print(f"\ncommit latency on loopback, 200 single-row commits: local p50 {statistics.median(local):.2f} ms "
          f"p99 {sorted(local)[197]:.2f} ms; synchronous p50 {statistics.median(remote):.2f} ms "
          f"p99 {sorted(remote)[197]:.2f} ms")

    registry = registry_on(cluster.url)
    async with RegistryClient(registry.address) as client:
        a_lease = await turn_a(client)
        b_lease = await pull_and_end(client, a_lease, turn_b_blocks())
        cluster.fail_over()  # right after the acknowledgements: no wait for the standby to replay

        # The next turn fences (the registry cannot tell a synchronous failover from another).
        turn_c = await answered(lambda: client.claim_reuse(claim_request(TENANT, CONV, [*TURN_B, *range(9000, 9100)])))
        assert turn_c.outcome == rpb.CLAIM_OUTCOME_NO_LEASE
        conversation = await client.get_conversation(rpb.GetConversationRequest(tenant=TENANT, conversation_id=CONV, include_events=True))
        leases = {lease.lease_id: lease for lease in conversation.leases}
        # Every acknowledged write survived: A's claim and consume, B's registration.
        assert leases[a_lease].state == tpb.LEASE_STATE_CONSUMED
        assert events_of(conversation, a_lease) == [
            ("LEASE_STATE_RETAINED", "REGISTERED"), ("LEASE_STATE_CLAIMED", "CLAIMED"),
            ("LEASE_STATE_CONSUMED", "PREFILL_READ"),
        ]
        assert events_of(conversation, b_lease)[:1] == [("LEASE_STATE_RETAINED", "REGISTERED")]
        # ... and B's lease, live at the failover, was fenced with its reason: reuse lost, not a write.
        assert events_of(conversation, b_lease)[1:] == [("LEASE_STATE_INVALIDATED", "TIMELINE_CHANGED")]
