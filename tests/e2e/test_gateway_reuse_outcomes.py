"""OpenAI's own conventions end to end, and every turn's reuse outcome (issue 16).

A stock `openai` client names its conversation only with `prompt_cache_key` (the client's
own parameter) or only with an `X-Session-Id` header, and reads
`usage.prompt_tokens_details.cached_tokens` streamed and not. Then the reuse outcome of
every turn — planned, delivered as the prefill engine reports it, and why a reuse was
declined — in the gateway's counters and in `boomerang status --json`, which reads them. Registry, router, simulated engines and gateway
are real processes on a database of their own.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support.gateway_stack import BOOMERANG, MODEL, GatewayStack, running_stack

pytestmark = pytest.mark.e2e
SYSTEM = "You are a careful coding agent. " + "Read the code before you change it and run the tests. " * 30


@pytest.fixture(scope="module")
def stack() -> Iterator[GatewayStack]:
    with running_stack() as s:
        yield s


@pytest.fixture(scope="module")
def key(stack: GatewayStack) -> str:
    return stack.new_key("reuse")


def user(i: int) -> dict[str, str]:
    return {"role": "user", "content": f"Step {i}: open file number {i} and " + "check the block cache. " * (10 + 5 * i)}


def counters(stack: GatewayStack) -> dict[str, float]:
    """The gateway's reuse counters, `declined:<reason>` for the declined turns."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(stack.gateway_url + "/metrics", timeout=5).text):
        for s in family.samples:
            if s.name.startswith("boomerang_gateway_reuse_") and s.name.endswith("_total"):
                name = s.name.removeprefix("boomerang_gateway_reuse_").removesuffix("_total")
                out[f"declined:{s.labels['reason']}" if "reason" in s.labels else name] = s.value
    return out


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after if after[k] - before.get(k, 0.0)}


async def test_prompt_cache_key_alone_names_the_conversation(stack: GatewayStack, key: str) -> None:
    conv = f"pck-{uuid.uuid4().hex}"
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    before = stack.stats()
    async with stack.openai_client(key) as c:
        for i in range(3):
            messages.append(user(i))
            raw = await c.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, max_tokens=16, prompt_cache_key=conv)  # type: ignore[arg-type]
            done = raw.parse()
            assert done.usage is not None and done.usage.prompt_tokens_details is not None
            cached = done.usage.prompt_tokens_details.cached_tokens
            plan, reused = raw.headers["x-boomerang-plan"], int(raw.headers["x-boomerang-reused-tokens"])
            if i == 0:
                assert (plan, cached) == ("COLD", 0)
            else:
                assert plan == "PULL" and cached == reused > 0, (i, plan, cached, reused)
                assert cached < done.usage.prompt_tokens
            messages.append({"role": "assistant", "content": done.choices[0].message.content or ""})
    assert stack.stats()["pulls"] - before["pulls"] == 2
    assert stack.unsafe() == 0


async def test_x_session_id_alone_names_the_conversation_streamed(stack: GatewayStack, key: str) -> None:
    conv = f"sid-{uuid.uuid4().hex}"
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    async with stack.openai_client(key, default_headers={"X-Session-Id": conv}) as c:
        for i in range(3):
            messages.append(user(i))
            raw = await c.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, max_tokens=16, stream=True, stream_options={"include_usage": True})
            text, usage = [], None
            async for chunk in raw.parse():
                if chunk.choices:
                    text.append(chunk.choices[0].delta.content or "")
                if chunk.usage is not None:
                    usage = chunk.usage
            assert usage is not None and usage.prompt_tokens_details is not None
            cached = usage.prompt_tokens_details.cached_tokens
            plan, reused = raw.headers["x-boomerang-plan"], int(raw.headers["x-boomerang-reused-tokens"])
            assert (plan, cached) == ("COLD", 0) if i == 0 else (plan == "PULL" and cached == reused > 0), (i, plan, cached)
            messages.append({"role": "assistant", "content": "".join(text)})


async def test_two_different_names_for_the_conversation_are_a_400(stack: GatewayStack, key: str) -> None:
    async with stack.openai_client(key, default_headers={"X-Session-Id": "b"}) as c:
        with pytest.raises(openai.BadRequestError) as err:
            await c.chat.completions.create(model=MODEL, messages=[user(0)], max_tokens=4, prompt_cache_key="a")  # type: ignore[arg-type]
        assert "prompt_cache_key" in err.value.message and "X-Session-Id" in err.value.message
        # The same name twice is one conversation.
        done = await c.chat.completions.create(model=MODEL, messages=[user(0)], max_tokens=4, prompt_cache_key="b")  # type: ignore[arg-type]
        assert done.usage is not None


def boomerang(*args: str) -> dict[str, Any]:
    out = subprocess.run([BOOMERANG, "status", "--json", *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


async def test_reuse_outcomes_in_counters_and_status(stack: GatewayStack, key: str) -> None:
    before = counters(stack)
    conv = f"edit-{uuid.uuid4().hex}"
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    planned = []
    async with stack.openai_client(key) as c:
        for i in range(3):
            messages.append(user(i))
            raw = await c.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, max_tokens=16, extra_body={"conversation_id": conv})
            messages.append({"role": "assistant", "content": raw.parse().choices[0].message.content or ""})
            planned.append(int(raw.headers["x-boomerang-reused-tokens"]))
        # The history edited at its very start: no block of the lease matches any more.
        edited = [{"role": "system", "content": "Forget that. " + SYSTEM}, *messages[1:], user(3)]
        raw = await c.chat.completions.with_raw_response.create(
            model=MODEL, messages=edited, max_tokens=16, extra_body={"conversation_id": conv})
        assert (raw.headers["x-boomerang-plan"], raw.headers["x-boomerang-reason"]) == ("RECOMPUTE", "PREFIX_MISMATCH")
        assert raw.parse().usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]
    moved = delta(before, counters(stack))
    assert moved["turns"] == 4 and moved["planned_tokens"] == sum(planned) > 0
    # The simulated prefill engine pulls what it is told to: delivered equals planned.
    assert moved["delivered_tokens"] == sum(planned) and "unreported_turns" not in moved
    # The first turn: ruled out by the live-lease summary (or, before its first snapshot, by the plan).
    first = {"declined:NO_LIVE_LEASE", "declined:NO_LEASE"}
    assert sum(moved.get(k, 0) for k in first) == 1 and moved["declined:PREFIX_MISMATCH"] == 1
    assert not any(k.startswith("declined:") for k in moved if k not in {*first, "declined:PREFIX_MISMATCH"})

    # `boomerang status` reads the same counters from the gateway's /metrics.
    gateway = counters(stack)
    api_flags = ["--registry", stack.procs["registry"].address, "--router", "", "--reaper", "", "--gateway", stack.gateway_url]
    o = boomerang(*api_flags)["reuse"]["outcomes"]
    assert o["turns"] == gateway["turns"] and o["planned_tokens"] == o["delivered_tokens"] == gateway["planned_tokens"]
    assert o["delivery_rate"] == 1.0 and o["reported_turns"] == o["turns"]
    misses = {m["reason"]: m["turns"] for m in o["misses_by_reason"]}
    # Read from the gateway's own counters: a turn the live-lease summary ruled out is NO_LIVE_LEASE.
    assert misses == {k.removeprefix("declined:"): int(v) for k, v in gateway.items() if k.startswith("declined:")}
    assert misses["PREFIX_MISMATCH"] >= 1 and o["reuse_rate"] == round(1 - sum(misses.values()) / o["turns"], 4)
    table = subprocess.run([BOOMERANG, "status", *api_flags], capture_output=True, text=True, timeout=60)
    assert table.returncode == 0 and "Reuse outcomes" in table.stdout and "PREFIX_MISMATCH" in table.stdout
