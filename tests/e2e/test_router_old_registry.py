"""A router newer than its registry (a rolling upgrade, the router first): the registry has no
CompleteTurn, so turns end the older way, MarkConsumed or ReleaseClaim then
RegisterRetainedBlocks, with the same outcomes.

The older registry is the real one behind `OldRegistry`, which answers CompleteTurn
UNIMPLEMENTED as a registry built before it would, and passes every other call through.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
from boomerang.clients.registry import RegistryClient
from boomerang.clients.router import RouterClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import types_pb2 as tpb

from tests.support.old_registry import OldRegistry
from tests.support.procs import ServiceProcess
from tests.support.router_stack import BS, handle, history, running_registry, running_router

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def registry(database_url: str) -> Iterator[ServiceProcess]:
    with running_registry(database_url) as proc:
        yield proc


@pytest.fixture(scope="module")
def old_registry(registry: ServiceProcess) -> Iterator[OldRegistry]:
    old = OldRegistry(registry.address, {"CompleteTurn"}).start()
    yield old
    old.stop()


@pytest.fixture(scope="module")
def router(database_url: str, old_registry: OldRegistry) -> Iterator[ServiceProcess]:
    with running_router(database_url, old_registry.address) as proc:
        yield proc


@pytest.fixture
async def clients(registry: ServiceProcess, router: ServiceProcess) -> AsyncIterator[tuple[RouterClient, RegistryClient]]:
    async with RouterClient(router.address, plan_timeout=5.0) as client, RegistryClient(registry.address) as rc:
        yield client, rc


async def test_turns_end_in_two_calls_with_the_same_outcomes(
    clients: tuple[RouterClient, RegistryClient], old_registry: OldRegistry, pg: asyncpg.Connection, unique: str
) -> None:
    client, rc = clients
    model, decode, conv = f"m-{unique}", f"d-{unique}", f"c-{unique}"
    for engine_id, role, port in ((f"p-{unique}", tpb.ENGINE_ROLE_PREFILL, 8100), (decode, tpb.ENGINE_ROLE_DECODE, 8200)):
        await rc.register_engine(rpb.RegisterEngineRequest(engine=tpb.Engine(
            engine_id=engine_id, role=role, model=model, side_channel_host="127.0.0.1", side_channel_port=5600,
            http_base_url=f"http://127.0.0.1:{port}", registration_generation=1, block_size=BS)))
    deadline = time.monotonic() + 10
    while len([e for e in (await client.list_engines(rtpb.RouterServiceListEnginesRequest(model=model))).engines
               if e.available]) < 2:
        assert time.monotonic() < deadline, "the engines never joined the router's pool"
        await asyncio.sleep(0.05)

    async def turn(prompt: list[int], out: list[int], use: int, tokens: int) -> tuple[rtpb.PlanTurnResponse,
                                                                                       rtpb.ReportTurnResponse]:
        plan = await client.plan_turn(rtpb.PlanTurnRequest(tenant="acme", conversation_id=conv, model=model,
                                                           prompt_token_ids=prompt))
        report = await client.report_turn(rtpb.ReportTurnRequest(
            tenant="acme", plan_id=plan.plan_id, handle_use=use,  # type: ignore[arg-type]
            decode_kv_transfer_params_json=handle(decode, tokens), prompt_token_ids=prompt, output_token_ids=out))
        return plan, report

    first_prompt, first_out = history(400, 1), history(80, 2)
    cold, registered = await turn(first_prompt, first_out, rtpb.HANDLE_USE_UNSPECIFIED, 480)
    assert cold.decision == rtpb.PLAN_DECISION_COLD
    assert registered.retention == rtpb.RETENTION_OUTCOME_REGISTERED and registered.lease.num_tokens == 480

    second = first_prompt + first_out + history(40, 3)
    pull, consumed = await turn(second, history(40, 4), rtpb.HANDLE_USE_READ, 560)
    assert pull.decision == rtpb.PLAN_DECISION_PULL and pull.reusable_tokens == 480
    assert consumed.claimed_lease_state == tpb.LEASE_STATE_CONSUMED
    assert consumed.retention == rtpb.RETENTION_OUTCOME_REGISTERED and consumed.lease.num_tokens == 560

    # A handle the prefill engine never read goes back to the conversation (ReleaseClaim); the
    # turn's own blocks are registered after it all the same.
    third = second + history(40, 4) + history(40, 5)
    given, released = await turn(third, history(40, 6), rtpb.HANDLE_USE_NOT_READ, 640)
    assert given.decision == rtpb.PLAN_DECISION_PULL
    assert released.retention == rtpb.RETENTION_OUTCOME_REGISTERED and released.lease.num_tokens == 640

    # One CompleteTurn was tried; the router remembered the answer and used the older calls.
    assert old_registry.calls["CompleteTurn"] == 1
    assert old_registry.calls["MarkConsumed"] >= 1 and old_registry.calls["ReleaseClaim"] >= 1
    assert old_registry.calls["RegisterRetainedBlocks"] >= 3
    rows = await pg.fetch(
        "SELECT l.num_tokens, l.state, array_agg(e.reason ORDER BY e.event_id) AS reasons FROM leases l "
        "JOIN lease_events e USING (lease_id) WHERE l.tenant = 'acme' AND l.conversation_id = $1 "
        "GROUP BY l.lease_id, l.num_tokens, l.state ORDER BY l.num_tokens", conv)
    trail = [(r["num_tokens"], r["state"], r["reasons"]) for r in rows]
    assert trail[0] == (480, "CONSUMED", ["REGISTERED", "CLAIMED", "PREFILL_READ"])
    assert trail[1][:2] == (560, "SUPERSEDED") and trail[1][2][:2] == ["REGISTERED", "CLAIMED"]
    assert trail[2] == (640, "RETAINED", ["REGISTERED"])
