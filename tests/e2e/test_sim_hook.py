"""`boomerang sim --hook` behind `boomerang gateway --engine-hook`: the engines run the vLLM
hook's own planner, sender and reporter (boomerang_vllm_hook), the gateway only routes.

Decode registers its retained blocks itself, prefill plans from its own token ids and pulls,
and the gateway never calls /tokenize or the router."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.gateway_stack import MODEL
from tests.support.hook_stack import HookStack, running_hook_stack
from tests.support.procs import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def stack(database_url: str) -> Iterator[HookStack]:
    with running_hook_stack(database_url) as s:
        yield s


def chat(stack: HookStack, messages: list[dict[str, str]], conversation: str) -> tuple[httpx.Response, str]:
    resp = httpx.post(stack.url("gateway") + "/v1/chat/completions", timeout=30,
                      json={"model": MODEL, "messages": messages, "max_tokens": 40},
                      headers={"X-Conversation-Id": conversation})
    assert resp.status_code == 200, resp.text
    return resp, resp.json()["choices"][0]["message"]["content"]


def test_the_engines_plan_register_and_pull_and_the_gateway_only_routes(stack: HookStack, unique: str) -> None:
    messages = [{"role": "system", "content": "You are terse. " * 40},
                {"role": "user", "content": "List the files. " + "context " * 300}]
    first, reply = chat(stack, messages, f"c-{unique}")
    assert first.headers["X-Boomerang-Plan"] == "ENGINE" and first.headers["X-Boomerang-Reason"] == "ENGINE_HOOK"
    # D's hook registered the turn it retained (its own sender), and heartbeats the engine.
    assert wait_for(lambda: stack.stats("decode")["hook"]["sender"]["registered"] == 1, 10), stack.stats("decode")
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Now the next step."}]
    second, _ = chat(stack, messages, f"c-{unique}")
    p, d = stack.stats("prefill"), stack.stats("decode")
    # P's hook planned both turns from its own token ids: no pull on the first (ruled out by the
    # live-lease summary, COLD, or computed locally when its plan came after its wait: the first
    # plan also connects the channel), a PULL on the second, and P pulled D's blocks.
    first_plan = sum(p["hook"].get(k, 0) for k in ("summary_ruled_out", "plan_cold", "plan_recompute",
                                                    "fallback_wait_over", "fallback_deadline_exceeded"))
    assert first_plan == 1 and p["hook"]["plan_pull"] == 1, p["hook"]
    assert p["pulls"] == 1 and p["pulled_tokens"] >= 64 and p["recent"][-1]["outcome"] == "ok", p["recent"]
    assert p["corrupt_pulls"] == p["expired_or_freed_reads"] == d["corrupt_loads"] == 0
    # The client's cached_tokens is P's own count of what it did not compute (the gateway
    # knows no plan here): nothing on the first turn, every pulled token on the second.
    cached = [r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] for r in (first, second)]
    assert cached == [0, p["pulled_tokens"]], cached
    # The gateway never tokenized, never planned, never reported.
    assert p["tokenize_requests"] == 0 and d["tokenize_requests"] == 0
    assert "tokenize" not in second.headers["Server-Timing"] and "plan;" not in second.headers["Server-Timing"]
    assert wait_for(lambda: stack.stats("decode")["hook"]["sender"]["registered"] == 2, 10)
    # P's reporter told the router both plans' outcomes (the PULL's handle as read).
    assert wait_for(lambda: stack.stats("prefill")["hook"]["reporter"]["reported"] == 2, 10), stack.stats("prefill")["hook"]
    assert p["hook"].get("hook_errors", 0) == 0 and d["hook"].get("hook_errors", 0) == 0
