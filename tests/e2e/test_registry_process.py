"""`boomerang registry` as a real process over gRPC against the real Postgres."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import grpc
import pytest
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.procs import ServiceProcess
from tests.support.registry_data import blocks_request, chain_proto, claim_request, engine_request
from tests.support.router_stack import running_registry

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def registry(database_url: str) -> Iterator[ServiceProcess]:
    with running_registry(database_url) as proc:
        yield proc


@pytest.fixture
async def client(registry: ServiceProcess) -> AsyncIterator[RegistryClient]:
    async with RegistryClient(registry.address) as c:
        yield c


async def expect_error(coro, code: str, reason: str | None = None, field: str | None = None) -> BoomerangClientError:  # type: ignore[no-untyped-def]
    with pytest.raises(BoomerangClientError) as err:
        await coro
    assert err.value.code == code, err.value
    if reason:
        assert err.value.reason == reason, err.value
    if field:
        assert field in [v.field for v in err.value.error.violations], err.value.error.violations
    return err.value


async def test_health_and_reflection(registry: ServiceProcess) -> None:
    async with grpc.aio.insecure_channel(registry.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "boomerang.v1.BlockRegistryService"):
            resp = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert resp.status == health_pb2.HealthCheckResponse.SERVING


async def test_turn_lifecycle_over_grpc(client: RegistryClient, unique: str) -> None:
    eid = f"d-{unique}"
    engine = (await client.register_engine(engine_request(eid))).engine
    assert engine.status == tpb.ENGINE_STATUS_ACTIVE and engine.kv_blocks_ttl_seconds == 480
    tokens = list(range(1000, 1300))
    reg = await client.register_retained_blocks(blocks_request("acme", unique, eid, tokens, request_id="r1"))
    assert reg.created and reg.lease.state == tpb.LEASE_STATE_RETAINED
    retry = await client.register_retained_blocks(blocks_request("acme", unique, eid, tokens, request_id="r1"))
    assert not retry.created and retry.lease.lease_id == reg.lease.lease_id
    claim = await client.claim_reuse(claim_request("acme", unique, tokens + [1, 2]))
    assert claim.outcome == rpb.CLAIM_OUTCOME_CLAIMED
    assert claim.reusable_tokens == 288 and claim.lease.remote_request_id == "r1"
    assert list(claim.lease.block_groups[0].block_ids)[:2] == [100, 101]
    read = rpb.TurnClaim(lease_id=claim.lease.lease_id, claim_id=claim.lease.claim_id, use=rpb.CLAIM_USE_READ)
    done = await client.complete_turn(rpb.CompleteTurnRequest(tenant="acme", claim=read))
    assert done.claim.error_code == 0 and done.claim.lease.state == tpb.LEASE_STATE_CONSUMED
    conv = await client.get_conversation(rpb.GetConversationRequest(tenant="acme", conversation_id=unique, include_events=True))
    assert [e.reason for e in conv.events] == ["REGISTERED", "CLAIMED", "PREFILL_READ"]
    engines = await client.list_engines(rpb.ListEnginesRequest(role=tpb.ENGINE_ROLE_DECODE))
    assert eid in [e.engine_id for e in engines.engines]


async def test_claim_batch_over_grpc_answers_each_claim(client: RegistryClient, unique: str) -> None:
    eid = f"d-{unique}"
    await client.register_engine(engine_request(eid))
    tokens = list(range(2000, 2300))
    for tenant in ("acme", "beta"):
        await client.register_retained_blocks(blocks_request(tenant, unique, eid, tokens))
    bad = rpb.ClaimReuseRequest(tenant="acme", conversation_id=unique)  # no prompt chain
    resp = await client.claim_reuse_batch(rpb.ClaimReuseBatchRequest(claims=[
        claim_request("acme", unique, tokens + [1]), bad, claim_request("beta", unique, tokens + [1]),
        claim_request("acme", unique, tokens + [1]),
    ]))
    outcomes = [r.response.outcome for r in resp.results]
    assert outcomes[0] == outcomes[2] == rpb.CLAIM_OUTCOME_CLAIMED
    assert resp.results[0].response.lease.tenant == "acme" and resp.results[2].response.lease.tenant == "beta"
    assert resp.results[0].response.reusable_tokens == 288
    assert resp.results[1].error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert resp.results[1].error_reason == "INVALID_REQUEST" and "prompt_chain" in resp.results[1].error_message
    assert outcomes[3] == rpb.CLAIM_OUTCOME_ALREADY_CLAIMED
    await expect_error(client.claim_reuse_batch(rpb.ClaimReuseBatchRequest()), "INVALID_ARGUMENT", field="claims")


async def test_registration_batch_over_grpc_commits_each_and_refuses_alone(client: RegistryClient, unique: str) -> None:
    eid = f"d-{unique}"
    await client.register_engine(engine_request(eid))
    tokens = list(range(3000, 3200))
    first = blocks_request("acme", f"{unique}-a", eid, tokens, request_id="ra")
    bad = rpb.RegisterRetainedBlocksRequest(tenant="acme", conversation_id=f"{unique}-b", engine_id=eid)
    stale = blocks_request("acme", f"{unique}-c", eid, tokens, generation=9)
    resp = await client.register_retained_blocks_batch(rpb.RegisterRetainedBlocksBatchRequest(registrations=[
        first, bad, stale, blocks_request("beta", f"{unique}-a", eid, tokens)]))
    r = resp.results
    assert r[0].error_code == 0 and r[0].response.created and r[0].response.lease.tenant == "acme"
    assert r[1].error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert r[2].error_code == grpc.StatusCode.FAILED_PRECONDITION.value[0] and r[2].error_reason == "GENERATION_NOT_REGISTERED"
    assert r[3].error_code == 0 and r[3].response.lease.tenant == "beta"
    again = await client.register_retained_blocks_batch(rpb.RegisterRetainedBlocksBatchRequest(registrations=[first]))
    assert not again.results[0].response.created
    assert again.results[0].response.lease.lease_id == r[0].response.lease.lease_id
    claim = await client.claim_reuse(claim_request("acme", f"{unique}-a", tokens + [1]))
    assert claim.outcome == rpb.CLAIM_OUTCOME_CLAIMED and claim.lease.lease_id == r[0].response.lease.lease_id
    await expect_error(client.register_retained_blocks_batch(rpb.RegisterRetainedBlocksBatchRequest()),
                       "INVALID_ARGUMENT", field="registrations")


async def test_bad_input_names_the_field_and_writes_nothing(client: RegistryClient, pg: asyncpg.Connection, unique: str) -> None:
    eid = f"d-{unique}"
    await client.register_engine(engine_request(eid))
    before = await pg.fetchval("SELECT count(*) FROM leases")
    bad = blocks_request("acme", unique, eid, list(range(100)))
    bad.ClearField("block_groups")
    bad.token_chain.num_tokens = 99
    err = await expect_error(client.register_retained_blocks(bad), "INVALID_ARGUMENT", "INVALID_REQUEST", "block_groups")
    assert "token_chain.num_tokens" in [v.field for v in err.error.violations]
    await expect_error(client.register_retained_blocks(rpb.RegisterRetainedBlocksRequest()), "INVALID_ARGUMENT", field="tenant")
    await expect_error(client.claim_reuse(rpb.ClaimReuseRequest(tenant="a", conversation_id="c")), "INVALID_ARGUMENT", field="prompt_chain")
    await expect_error(client.register_engine(rpb.RegisterEngineRequest(engine=tpb.Engine(engine_id="x y"))), "INVALID_ARGUMENT", field="engine.role")
    await expect_error(client.list_leases(rpb.ListLeasesRequest(page_token="garbage")), "INVALID_ARGUMENT", field="page_token")
    not_read = rpb.TurnClaim(lease_id="nope", claim_id="c", use=rpb.CLAIM_USE_NOT_READ)
    await expect_error(client.complete_turn(rpb.CompleteTurnRequest(tenant="a", claim=not_read)), "INVALID_ARGUMENT", field="claim.lease_id")
    assert await pg.fetchval("SELECT count(*) FROM leases") == before


async def test_not_found_and_failed_precondition(client: RegistryClient, unique: str) -> None:
    await expect_error(client.get_conversation(rpb.GetConversationRequest(tenant="a", conversation_id=unique)), "NOT_FOUND", "CONVERSATION_NOT_FOUND")
    await expect_error(client.heartbeat(rpb.HeartbeatRequest(engine_id=f"ghost-{unique}", registration_generation=1)), "NOT_FOUND", "ENGINE_NOT_FOUND")
    await expect_error(
        client.register_retained_blocks(blocks_request("a", unique, f"ghost-{unique}", list(range(50)))),
        "FAILED_PRECONDITION", "ENGINE_NOT_REGISTERED",
    )
    eid = f"d-{unique}"
    await client.register_engine(engine_request(eid, generation=3))
    await expect_error(client.heartbeat(rpb.HeartbeatRequest(engine_id=eid, registration_generation=2)), "FAILED_PRECONDITION", "STALE_GENERATION")
    await expect_error(
        client.register_retained_blocks(blocks_request("a", unique, eid, list(range(50)), generation=2)),
        "FAILED_PRECONDITION", "STALE_GENERATION",
    )
    ghost = rpb.TurnClaim(lease_id=str(uuid.uuid4()), claim_id="c", use=rpb.CLAIM_USE_READ)
    gone = await client.complete_turn(rpb.CompleteTurnRequest(tenant="a", claim=ghost))
    assert (gone.claim.error_code, gone.claim.error_reason) == (grpc.StatusCode.NOT_FOUND.value[0], "LEASE_NOT_FOUND")


async def test_oversize_message_is_resource_exhausted(client: RegistryClient, unique: str) -> None:
    req = claim_request("a", unique, [1])
    req.prompt_chain.block_hashes = b"x" * (17 * 1024 * 1024)
    with pytest.raises(BoomerangClientError) as err:
        await client.claim_reuse(req)
    assert err.value.code == "RESOURCE_EXHAUSTED"


async def test_list_leases_pages_through_everything(client: RegistryClient, unique: str) -> None:
    eid = f"d-{unique}"
    await client.register_engine(engine_request(eid))
    for i in range(7):
        await client.register_retained_blocks(blocks_request("pager", f"{unique}-{i}", eid, list(range(40))))
    seen, token = [], ""
    while True:
        page = await client.list_leases(rpb.ListLeasesRequest(engine_id=eid, page_size=3, page_token=token))
        seen += [lease.lease_id for lease in page.leases]
        token = page.next_page_token
        if not token:
            break
    assert len(seen) == len(set(seen)) == 7


async def test_sigkill_mid_burst_keeps_every_acknowledged_lease(database_url: str, pg: asyncpg.Connection, unique: str) -> None:
    proc = ServiceProcess(["registry", "--listen", "127.0.0.1:0"], {"BOOMERANG_DATABASE_URL": database_url}).start()
    eid = f"d-{unique}"
    acked: set[str] = set()
    sent: set[str] = set()
    async with RegistryClient(proc.address, timeout=3.0) as client:
        await client.register_engine(engine_request(eid))

        async def one(i: int) -> None:
            rid = f"{unique}-{i}"
            sent.add(rid)
            resp = await client.register_retained_blocks(blocks_request("burst", rid, eid, list(range(64)), request_id=rid))
            acked.add(resp.lease.remote_request_id)

        tasks = [asyncio.create_task(one(i)) for i in range(400)]
        await asyncio.sleep(0.3)
        proc.kill()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert acked, "the burst should have had acknowledged registrations before the kill"
    restarted = ServiceProcess(["registry", "--listen", "127.0.0.1:0"], {"BOOMERANG_DATABASE_URL": database_url}).start()
    try:
        rows = await pg.fetch("SELECT remote_request_id, count(*) AS n FROM leases WHERE engine_id = $1 GROUP BY 1", eid)
        stored = {r["remote_request_id"]: r["n"] for r in rows}
        assert acked <= set(stored), "an acknowledged lease is missing after SIGKILL"
        assert all(n == 1 for n in stored.values())
        assert set(stored) <= sent
        # No half-written lease: each stored one has exactly its REGISTERED event.
        orphans = await pg.fetchval(
            "SELECT count(*) FROM leases l WHERE l.engine_id = $1 AND (SELECT count(*) FROM lease_events e "
            "WHERE e.lease_id = l.lease_id AND e.reason = 'REGISTERED') <> 1", eid,
        )
        assert orphans == 0
        async with RegistryClient(restarted.address) as client:
            conv = next(iter(acked))
            got = await client.get_conversation(rpb.GetConversationRequest(tenant="burst", conversation_id=conv))
            assert got.leases[0].remote_request_id == conv
    finally:
        restarted.kill()


async def test_sigterm_drains_in_flight_calls(database_url: str, unique: str) -> None:
    proc = ServiceProcess(["registry", "--listen", "127.0.0.1:0", "--grace-seconds", "5"], {"BOOMERANG_DATABASE_URL": database_url}).start()
    eid = f"d-{unique}"
    async with RegistryClient(proc.address) as client:
        await client.register_engine(engine_request(eid))
        calls = [
            asyncio.create_task(client.register_retained_blocks(blocks_request("drain", f"{unique}-{i}", eid, list(range(64)))))
            for i in range(30)
        ]
        await asyncio.sleep(0.02)
        stopper = asyncio.get_running_loop().run_in_executor(None, proc.terminate)
        results = await asyncio.gather(*calls, return_exceptions=True)
        code = await stopper
    failures = [r for r in results if isinstance(r, Exception)]
    # The service keeps serving through its drain delay, so calls on their way all land.
    assert failures == [], (failures, proc.output())
    assert code == 0


def test_bad_configuration_is_a_clear_error() -> None:
    import subprocess

    from tests.support.procs import BOOMERANG

    out = subprocess.run([BOOMERANG, "registry", "--listen", "nonsense"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "BOOMERANG_DATABASE_URL": "postgresql://x@127.0.0.1/x"})
    assert out.returncode == 1
    assert out.stderr.strip() == ("boomerang registry: invalid configuration: BOOMERANG_LISTEN (--listen): must be "
                                  "HOST:PORT, e.g. 127.0.0.1:50051 (port 0 picks a free one); fix that flag or variable")
    out = subprocess.run([BOOMERANG, "registry"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode != 0 and "set BOOMERANG_DATABASE_URL" in out.stderr
    _ = chain_proto


async def test_metrics_endpoint_reports_claims_and_leases(database_url: str, unique: str) -> None:
    import httpx

    proc = ServiceProcess(
        ["registry", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"], {"BOOMERANG_DATABASE_URL": database_url}
    ).start()
    try:
        metrics_line = next(line for line in proc.lines if line.startswith("BOOMERANG_METRICS"))
        metrics_url = f"http://{metrics_line.split()[-1]}/metrics"
        eid = f"d-{unique}"
        async with RegistryClient(proc.address) as client:
            await client.register_engine(engine_request(eid))
            tokens = list(range(500))
            await client.register_retained_blocks(blocks_request("m", unique, eid, tokens))
            await client.claim_reuse(claim_request("m", unique, tokens + [1]))
            await client.claim_reuse(claim_request("m", unique + "x", tokens))
        async with httpx.AsyncClient() as http:
            body = ""
            # Gauges refresh every 5 s, and a refresh between RegisterEngine and the
            # registration shows the engine holding nothing: wait for the figure itself.
            for _ in range(60):
                body = (await http.get(metrics_url)).text
                if f'boomerang_retained_bytes{{engine_id="{eid}"}} {32 * 4096}.0' in body:
                    break
                await asyncio.sleep(0.25)
        assert 'boomerang_registry_claims_total{outcome="CLAIMED"} 1.0' in body
        assert 'boomerang_registry_claims_total{outcome="NO_LEASE"} 1.0' in body
        assert 'boomerang_registry_registrations_total{result="created"} 1.0' in body
        assert "boomerang_registry_claim_seconds_bucket" in body
        assert f'boomerang_retained_blocks{{engine_id="{eid}"}} 32.0' in body
        assert f'boomerang_retained_bytes{{engine_id="{eid}"}} {32 * 4096}.0' in body
    finally:
        proc.kill()
