"""`boomerang control-plane`: the registry and the router in one process, on one port.

The gateway, the simulated engines and the stock OpenAI client reach both services at the one
address; the router's registry calls are in-process. A conversation's later turns PULL with no
corrupt pull, each plan is in `turn_plans`, a bad request to either API gets its proper status,
and SIGTERM stops the process cleanly.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient
from boomerang.clients.router import RouterClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import router_service_pb2 as rtpb

from tests.support.databases import fresh_database
from tests.support.gateway_stack import MODEL, GatewayStack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack() -> Iterator[GatewayStack]:
    with fresh_database() as url:
        s = GatewayStack(url, gateway_args=["--allow-anonymous"], control_plane=True)
        s.start()
        try:
            yield s
        finally:
            s.stop()


async def conversation(stack: GatewayStack, turns: int) -> tuple[list[str], list[str]]:
    """A new conversation's turns through the gateway: each turn's plan header and plan id."""
    conv = f"cp-{uuid.uuid4().hex[:8]}"
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent. " + "Read, edit. " * 80}]
    plans, ids = [], []
    async with stack.openai_client("unused") as client:
        for turn in range(turns):
            messages.append({"role": "user", "content": f"Step {turn}: open the next file."})
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, max_tokens=16, extra_body={"conversation_id": conv})
            plans.append(raw.headers["x-boomerang-plan"])
            ids.append(raw.headers.get("x-boomerang-plan-id", ""))
            messages.append({"role": "assistant", "content": raw.parse().choices[0].message.content or ""})
    return plans, ids


async def test_later_turns_pull_through_the_one_process(stack: GatewayStack) -> None:
    plans, ids = await conversation(stack, 4)
    assert plans[0] == "COLD" and plans[1:] == ["PULL"] * 3, plans
    assert stack.unsafe() == 0
    conn = await asyncpg.connect(stack.database_url)
    try:
        found = await conn.fetchval("SELECT count(*) FROM turn_plans WHERE plan_id = ANY($1::uuid[])",
                                    [i for i in ids if i])
    finally:
        await conn.close()
    assert found == len([i for i in ids if i]) >= 3


async def test_each_api_answers_a_bad_request_with_its_status(stack: GatewayStack) -> None:
    address = stack.procs["control-plane"].address
    async with RegistryClient(address, timeout=5) as registry, RouterClient(address, timeout=5) as router:
        with pytest.raises(BoomerangClientError) as claim:
            await registry.claim_reuse(rpb.ClaimReuseRequest(tenant="", conversation_id="c"))
        assert claim.value.code == "INVALID_ARGUMENT"
        with pytest.raises(BoomerangClientError) as plan:
            await router.plan_turn(rtpb.PlanTurnRequest(tenant="acme", model=MODEL))
        assert plan.value.code == "INVALID_ARGUMENT"


@pytest.fixture(scope="module")
def with_gateway() -> Iterator[GatewayStack]:
    with fresh_database() as url:
        s = GatewayStack(url, control_plane=True, gateway_env={"BOOMERANG_ALLOW_ANONYMOUS": "true"})
        s.start()
        try:
            yield s
        finally:
            s.stop()


async def test_the_gateway_in_the_process_pulls_and_drains_first(with_gateway: GatewayStack) -> None:
    """`--gateway-listen`: the gateway's plans and reports are in-process calls. Later turns
    PULL; SIGTERM drains the gateway (its last report lands) before the gRPC services stop."""
    stack = with_gateway
    proc = stack.procs["control-plane"]
    assert set(proc.addresses) == {"control-plane", "gateway"}
    assert proc.addresses["gateway"] != proc.addresses["control-plane"]
    plans, ids = await conversation(stack, 3)
    assert plans == ["COLD", "PULL", "PULL"], plans
    assert stack.unsafe() == 0
    assert proc.terminate() == 0
    out = proc.output()
    assert out.index("gateway stopped") < out.index("control-plane stopped"), out
    conn = await asyncpg.connect(stack.database_url)
    try:
        reported = await conn.fetchval(
            "SELECT count(*) FROM turn_plans WHERE plan_id = ANY($1::uuid[]) AND reported_at IS NOT NULL",
            [i for i in ids if i])
    finally:
        await conn.close()
    assert reported == len([i for i in ids if i]) >= 2
