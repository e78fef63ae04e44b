"""ReportTurnBatch over real `boomerang router` and `boomerang registry` processes on Postgres:
the batch validated as a whole, each report as ReportTurn validates and settles it, one
answer per report in order, and a tenant's report never reaching another tenant's plan."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient
from boomerang.clients.router import RouterClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import types_pb2 as tpb
from boomerang_router.plan_store import new_plan_id

from tests.support.procs import ServiceProcess
from tests.support.router_stack import BS, handle, history, running_registry, running_router

pytestmark = pytest.mark.e2e
INVALID_ARGUMENT, NOT_FOUND = 3, 5


@pytest.fixture(scope="module")
def registry(database_url: str) -> Iterator[ServiceProcess]:
    with running_registry(database_url) as proc:
        yield proc


@pytest.fixture(scope="module")
def router(database_url: str, registry: ServiceProcess) -> Iterator[ServiceProcess]:
    with running_router(database_url, registry.address) as proc:
        yield proc


@pytest.fixture
async def clients(registry: ServiceProcess, router: ServiceProcess) -> AsyncIterator[tuple[RouterClient, RegistryClient]]:
    async with RouterClient(router.address, plan_timeout=5.0) as client, RegistryClient(registry.address) as rc:
        yield client, rc


async def engines(client: RouterClient, rc: RegistryClient, unique: str) -> tuple[str, str]:
    """A prefill and a decode engine of a model of their own, in the router's pool; (model, decode id)."""
    model, decode = f"m-{unique}", f"d-{unique}"
    for engine_id, role, port in ((f"p-{unique}", tpb.ENGINE_ROLE_PREFILL, 8100), (decode, tpb.ENGINE_ROLE_DECODE, 8200)):
        await rc.register_engine(rpb.RegisterEngineRequest(engine=tpb.Engine(
            engine_id=engine_id, role=role, model=model, side_channel_host="127.0.0.1", side_channel_port=5600,
            http_base_url=f"http://127.0.0.1:{port}", registration_generation=1, block_size=BS)))
    deadline = time.monotonic() + 10
    while True:
        pool = await client.list_engines(rtpb.RouterServiceListEnginesRequest(model=model))
        if len([e for e in pool.engines if e.available]) == 2:
            return model, decode
        assert time.monotonic() < deadline, "the engines never joined the router's pool"
        await asyncio.sleep(0.05)


async def plan(client: RouterClient, tenant: str, conversation: str, model: str, prompt: list[int]) -> rtpb.PlanTurnResponse:
    return await client.plan_turn(rtpb.PlanTurnRequest(tenant=tenant, conversation_id=conversation, model=model,
                                                       prompt_token_ids=prompt))


async def reported(client: RouterClient, tenant: str, plan_id: str) -> bool:
    got = await client.get_turn_plan(rtpb.GetTurnPlanRequest(tenant=tenant, plan_id=plan_id))
    return bool(got.plan.HasField("report_time"))


def error_of(result: rtpb.ReportTurnBatchResult) -> tuple[int, str]:
    return result.error_code, result.error_reason


async def test_an_empty_or_oversized_batch_is_refused_whole_and_changes_nothing(
    clients: tuple[RouterClient, RegistryClient], unique: str
) -> None:
    client, rc = clients
    model, _ = await engines(client, rc, unique)
    first = await plan(client, "acme", f"c-{unique}", model, history(100, 1))
    with pytest.raises(BoomerangClientError) as err:
        await client.report_turn_batch(rtpb.ReportTurnBatchRequest())
    assert (err.value.code, err.value.reason) == ("INVALID_ARGUMENT", "INVALID_REQUEST")
    assert "reports: must hold 1 to 256 reports (got 0)" in str(err.value)
    ok = rtpb.ReportTurnRequest(tenant="acme", plan_id=first.plan_id)
    with pytest.raises(BoomerangClientError) as err:
        await client.report_turn_batch(rtpb.ReportTurnBatchRequest(reports=[ok] * 257))
    assert err.value.code == "INVALID_ARGUMENT" and "(got 257)" in str(err.value)
    assert not await reported(client, "acme", first.plan_id)  # nothing of a refused batch was settled


async def test_each_report_answered_in_order_one_refusal_refusing_no_other(
    clients: tuple[RouterClient, RegistryClient], pg: asyncpg.Connection, unique: str
) -> None:
    client, rc = clients
    model, decode = await engines(client, rc, unique)
    prompt, out = history(400, 1), history(80, 2)
    conv_a, conv_b = f"a-{unique}", f"b-{unique}"
    a = await plan(client, "acme", conv_a, model, prompt)
    b = await plan(client, "acme", conv_b, model, prompt)
    reports = [
        rtpb.ReportTurnRequest(tenant="acme", plan_id=a.plan_id, decode_kv_transfer_params_json=handle(decode, 480),
                               prompt_token_ids=prompt, output_token_ids=out),
        rtpb.ReportTurnRequest(tenant="acme", plan_id="not-a-plan-id"),
        rtpb.ReportTurnRequest(tenant="acme", plan_id=b.plan_id),
        rtpb.ReportTurnRequest(tenant="acme", plan_id=new_plan_id(time.time())),
    ]
    resp = await client.report_turn_batch(rtpb.ReportTurnBatchRequest(reports=reports))
    assert len(resp.results) == 4
    first, bad, plain, unknown = resp.results
    assert first.error_code == 0 and first.response.plan_id == a.plan_id
    assert first.response.retention == rtpb.RETENTION_OUTCOME_REGISTERED and first.response.lease.num_tokens == 480
    assert error_of(bad) == (INVALID_ARGUMENT, "INVALID_REQUEST") and "plan_id" in bad.error_message
    assert plain.error_code == 0 and plain.response.plan_id == b.plan_id
    assert plain.response.retention == rtpb.RETENTION_OUTCOME_NOT_RETAINED
    assert error_of(unknown) == (NOT_FOUND, "PLAN_NOT_FOUND")
    assert await reported(client, "acme", a.plan_id) and await reported(client, "acme", b.plan_id)

    # The next turn pulls what the batch registered; its report, in a batch too, consumes the
    # claim and registers the turn after it (CompleteTurn, as for ReportTurn).
    follow = prompt + out + history(40, 3)
    pull = await plan(client, "acme", conv_a, model, follow)
    assert pull.decision == rtpb.PLAN_DECISION_PULL and pull.reusable_tokens == 480
    again = await client.report_turn_batch(rtpb.ReportTurnBatchRequest(reports=[rtpb.ReportTurnRequest(
        tenant="acme", plan_id=pull.plan_id, handle_use=rtpb.HANDLE_USE_READ,
        decode_kv_transfer_params_json=handle(decode, 560), prompt_token_ids=follow, output_token_ids=history(40, 4))]))
    (settled,) = again.results
    assert settled.error_code == 0 and settled.response.claimed_lease_state == tpb.LEASE_STATE_CONSUMED
    assert settled.response.retention == rtpb.RETENTION_OUTCOME_REGISTERED
    states = await pg.fetch("SELECT state FROM leases WHERE tenant = 'acme' AND conversation_id = $1 ORDER BY created_at",
                            conv_a)
    assert [r["state"] for r in states] == ["CONSUMED", "RETAINED"]

    # A repeated batch repeats nothing but the answers.
    repeat = await client.report_turn_batch(rtpb.ReportTurnBatchRequest(reports=reports[:1]))
    assert repeat.results[0].response.retention == rtpb.RETENTION_OUTCOME_ALREADY_REGISTERED


async def test_a_report_reaches_only_its_own_tenants_plan(
    clients: tuple[RouterClient, RegistryClient], unique: str
) -> None:
    client, rc = clients
    model, _ = await engines(client, rc, unique)
    theirs = await plan(client, "acme", f"c-{unique}", model, history(100, 1))
    ours = await plan(client, "other", f"c-{unique}", model, history(100, 1))
    resp = await client.report_turn_batch(rtpb.ReportTurnBatchRequest(reports=[
        rtpb.ReportTurnRequest(tenant="other", plan_id=theirs.plan_id),
        rtpb.ReportTurnRequest(tenant="other", plan_id=ours.plan_id),
    ]))
    assert error_of(resp.results[0]) == (NOT_FOUND, "PLAN_NOT_FOUND")
    assert resp.results[1].error_code == 0 and resp.results[1].response.plan_id == ours.plan_id
    assert not await reported(client, "acme", theirs.plan_id), "another tenant's report settled acme's plan"
    assert await reported(client, "other", ours.plan_id)
    mine = await client.report_turn_batch(rtpb.ReportTurnBatchRequest(reports=[
        rtpb.ReportTurnRequest(tenant="acme", plan_id=theirs.plan_id)]))
    assert mine.results[0].error_code == 0 and await reported(client, "acme", theirs.plan_id)
