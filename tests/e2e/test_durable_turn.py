"""A turn's lease is durable before the client sees the end of the turn (issue 15, point 2).

The whole control plane — registry, router, reaper and gateway — is SIGKILLed the moment a
turn's answer has reached the client (the non-streamed body, or the streamed `[DONE]`),
then started again on the same database. The simulated engines live on and still hold the
turn's blocks, so the next turn of the conversation PULLs them: the registration was
committed before the client had its last byte, not left in flight behind it.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.support.databases import fresh_database
from tests.support.gateway_stack import MODEL, GatewayStack
from tests.support.procs import ServiceProcess

pytestmark = pytest.mark.e2e
CONTROL_PLANE = ("gateway", "reaper", "router", "registry")


@pytest.fixture
def stack() -> Iterator[GatewayStack]:
    with fresh_database() as url:
        s = GatewayStack(url, gateway_args=["--allow-anonymous"])
        s.start()
        s._proc("reaper", ["reaper", "--listen", "127.0.0.1:0", "--registry", s.procs["registry"].address]).start()
        try:
            yield s
        finally:
            s.stop()


def _kill_control_plane(stack: GatewayStack) -> None:
    with ThreadPoolExecutor(len(CONTROL_PLANE)) as pool:
        list(pool.map(lambda name: stack.procs[name].kill(), CONTROL_PLANE))


def _restart_control_plane(stack: GatewayStack) -> None:
    """Registry, router and reaper on their old ports (the engines heartbeat to that address)."""
    for name in ("registry", "router", "reaper"):
        old = stack.procs[name]
        args = [a if a != "127.0.0.1:0" else old.address for a in old.args]
        stack.procs[name] = ServiceProcess(args, stack.env, name=name).start()
    old = stack.procs["gateway"]
    stack.procs["gateway"] = ServiceProcess(old.args, stack.env, name="gateway").start()
    stack.wait_models()


def _history() -> list[dict[str, str]]:
    return [{"role": "system", "content": "You are a coding agent. " + "Read, edit, test. " * 60},
            {"role": "user", "content": "Open the first file."}]


def _turn(stack: GatewayStack, conversation: str, messages: list[dict[str, str]], stream: bool) -> tuple[str, str]:
    """One turn; (plan, reply). Returns only once the client has the whole answer."""
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": 16, "conversation_id": conversation,
                            "stream": stream}
    with httpx.Client(timeout=60) as http:
        if not stream:
            resp = http.post(stack.gateway_url + "/v1/chat/completions", json=body)
            assert resp.status_code == 200, resp.text
            return resp.headers["x-boomerang-plan"], resp.json()["choices"][0]["message"]["content"]
        text = []
        with http.stream("POST", stack.gateway_url + "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            plan = resp.headers["x-boomerang-plan"]
            for line in resp.iter_lines():
                if line == "data: [DONE]":
                    break
                if line.startswith("data: "):
                    for choice in json.loads(line[6:]).get("choices") or []:
                        text.append((choice.get("delta") or {}).get("content") or "")
            else:
                raise AssertionError("the stream ended without [DONE]")
        return plan, "".join(text)


@pytest.mark.parametrize("stream", [False, True], ids=["non-streamed", "streamed"])
async def test_control_plane_killed_right_after_a_turn_the_next_turn_pulls(stack: GatewayStack, stream: bool) -> None:
    conversation = f"durable-{uuid.uuid4().hex[:8]}"
    messages = _history()
    plan, reply = await asyncio.to_thread(_turn, stack, conversation, messages, stream)
    # SIGKILL the moment the answer is in: nothing in flight survives.
    await asyncio.to_thread(_kill_control_plane, stack)
    assert plan == "COLD"
    await asyncio.to_thread(_restart_control_plane, stack)
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Now the second file."}]
    plan, _ = await asyncio.to_thread(_turn, stack, conversation, messages, stream)
    assert plan == "PULL", (stack.procs["router"].output()[-3000:], stack.procs["gateway"].output()[-3000:])
    assert await asyncio.to_thread(stack.unsafe) == 0
