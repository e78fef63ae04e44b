"""What the router learns from the gateway's reports, end to end (issue 34): each turn
prefilled on P reports D's time to first token after the hand-off, and the router's pool shows
D's first step learned from it instead of the configured default.

Real processes (registry, router, simulated engines at time scale 0, gateway) with learning
on, which the other tests turn off; a stock OpenAI client's conversation through the gateway.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from boomerang.clients.router import RouterClient
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import types_pb2 as tpb

from tests.support.databases import fresh_database
from tests.support.gateway_stack import MODEL, GatewayStack

pytestmark = pytest.mark.e2e
DEFAULT_ITL_MS = 43.0  # BOOMERANG_TTFT_INTER_TOKEN_MS's default


@pytest.fixture(scope="module")
def stack() -> Iterator[GatewayStack]:
    with fresh_database("boomerang_learn") as url:
        s = GatewayStack(url)
        s.env["BOOMERANG_TTFT_LEARNING_TURNS"] = "30"
        try:
            yield s.start()
        finally:
            s.stop()


async def test_turns_prefilled_on_p_teach_the_router_d_s_first_step(stack: GatewayStack) -> None:
    conv = f"conv-{uuid.uuid4().hex}"
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief. " * 100}]
    async with stack.openai_client(stack.new_key("learn")) as client:
        for i in range(3):
            messages.append({"role": "user", "content": f"Turn {i}: " + "read the log. " * 40})
            reply = await client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=8, extra_body={"conversation_id": conv})  # type: ignore[arg-type]
            messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
    async with RouterClient(stack.procs["router"].address) as router:
        pool = await router.list_engines(rtpb.RouterServiceListEnginesRequest(model=MODEL))
    served = [p for p in pool.engines if p.engine.role == tpb.ENGINE_ROLE_DECODE and p.inter_token_ms != DEFAULT_ITL_MS]
    assert served, [(p.engine.engine_id, p.inter_token_ms) for p in pool.engines]
    # Until measured the step is the learned inter-token gap; measured, it is D's own time to
    # first token after the hand-off, which on time-scale-0 engines is a few ms of HTTP.
    for p in served:
        assert p.first_step_ms != p.inter_token_ms and 0 <= p.first_step_ms < DEFAULT_ITL_MS, p
