"""A turn prefilled on the decode engine that holds the history (PREFILL_ON_DECODE), through the
real gateway, router, registry and simulated engines.

With `BOOMERANG_PREFILL_ON_DECODE` the gateway lets the router plan it, and the router does
when that is predicted fastest (here: a short new turn over a history the decode engine
holds, planned from the configured costs). The gateway then sends the request straight to
that decode engine with no `kv_transfer_params`: the prefill engine sees nothing of the
turn, nothing is pulled or loaded, the claim goes back to the conversation, and the turn is
reported with D's measured time to first token.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from boomerang.clients.router import RouterClient
from boomerang.v1 import router_service_pb2 as rtpb

from tests.support.databases import fresh_database
from tests.support.gateway_stack import MODEL, GatewayStack

pytestmark = pytest.mark.e2e
SYSTEM = "You are a careful coding agent. " + "Read the code before you change it and run the tests. " * 30


@pytest.fixture(scope="module")
def stack() -> Iterator[GatewayStack]:
    with fresh_database("boomerang_gw") as url:
        s = GatewayStack(url)
        s.env["BOOMERANG_PREFILL_ON_DECODE"] = "true"
        s.start()
        try:
            yield s
        finally:
            s.stop()


async def chat(c: openai.AsyncOpenAI, messages: list[dict[str, Any]], conv: str, stream: bool) -> tuple[str, dict[str, str]]:
    """One turn: the reply and the Boomerang headers."""
    if not stream:
        raw = await c.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=24, extra_body={"conversation_id": conv})
        reply = raw.parse().choices[0].message.content or ""
        return reply, {k.lower(): v for k, v in raw.headers.items() if k.lower().startswith("x-boomerang")}
    async with c.chat.completions.with_streaming_response.create(
            model=MODEL, messages=messages, max_tokens=24, stream=True, extra_body={"conversation_id": conv}) as raw:
        parts = [chunk.choices[0].delta.content or "" async for chunk in await raw.parse() if chunk.choices]
        return "".join(parts), {k.lower(): v for k, v in raw.headers.items() if k.lower().startswith("x-boomerang")}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_short_turn_over_a_held_history_is_prefilled_on_d(stack: GatewayStack, stream: bool) -> None:
    tenant = f"pod-{uuid.uuid4().hex[:8]}"
    tenant_key = stack.create_tenant(tenant)
    conv = f"conv-{uuid.uuid4().hex}"
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": "List the files."}]
    async with stack.openai_client(tenant_key) as c:
        reply, headers = await chat(c, messages, conv, stream)
        assert reply and headers["x-boomerang-plan"] == "COLD"
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Open the first one."}]
        p_before, d_before = stack.stats("prefill"), stack.stats("decode")
        reply, headers = await chat(c, messages, conv, stream)
        p_after, d_after = stack.stats("prefill"), stack.stats("decode")
    assert reply
    assert headers["x-boomerang-plan"] == "PREFILL_ON_DECODE", headers
    assert int(headers["x-boomerang-reused-tokens"]) > 0
    assert p_after["requests"] == p_before["requests"]  # P never saw the turn
    assert d_after["requests"] == d_before["requests"] + 1
    assert (d_after["loads"], p_after["pulls"]) == (d_before["loads"], p_before["pulls"])  # nothing moved
    assert stack.unsafe() == 0
    plan_id = headers["x-boomerang-plan-id"]
    async with RouterClient(stack.procs["router"].address) as router:
        plans = (await router.list_turn_plans(rtpb.ListTurnPlansRequest(tenant=tenant, conversation_id=conv))).plans
    [turn] = [p for p in plans if p.plan_id == plan_id]
    assert turn.decision == rtpb.PLAN_DECISION_PREFILL_ON_DECODE
    assert turn.decode_engine.http_base_url.rstrip("/") == stack.sim_url("decode")
    assert turn.outcome == "COMPUTED" and turn.HasField("report_time")

