"""`boomerang sim --hook` behind `boomerang gateway --engine-hook`: the engines run the vLLM
hook's own planner, sender and reporter (boomerang.vllm_hook), the gateway only routes.

Decode registers its retained blocks itself, prefill plans from its own token ids and pulls,
and the gateway never calls /tokenize or the router."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.support.procs import ServiceProcess, wait_for

pytestmark = pytest.mark.e2e
MODEL = "Qwen/Qwen3-32B"


class HookStack:
    """Registry, router, two hooked simulated engines and a gateway in engine-hook mode."""

    def __init__(self, database_url: str):
        self.env = {"BOOMERANG_DATABASE_URL": database_url, "BOOMERANG_CLAIM_DEADLINE_MS": "2000",
                    "BOOMERANG_POOL_REFRESH_SECONDS": "0.2", "BOOMERANG_DRAIN_DELAY_SECONDS": "0"}
        self.procs: dict[str, ServiceProcess] = {}

    def start(self) -> HookStack:
        registry = self._proc("registry", ["registry", "--listen", "127.0.0.1:0"]).start().address
        router = self._proc("router", ["router", "--listen", "127.0.0.1:0", "--registry", registry,
                                       "--engine-refresh-seconds", "0.2"]).start().address
        common = ["sim", "--port", "0", "--hook", "--registry", registry, "--heartbeat-seconds", "0.5",
                  "--time-scale", "0.01"]
        # A request waits for its plan up to all the prefill it could save (share 1): this test is
        # about what the plans do, and a busy machine must not turn them into local computes.
        sims = [self._proc("prefill", [*common, "--role", "prefill", "--router", router, "--plan-deadline-ms", "1000",
                                       "--plan-wait-share", "1"]),
                self._proc("decode", [*common, "--role", "decode"])]
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda p: p.start(), sims))
        self._proc("gateway", ["gateway", "--listen", "127.0.0.1:0", "--engine-hook", "--registry", registry,
                               "--allow-anonymous"]).start()
        assert wait_for(self._ready, 30), self.procs["gateway"].output()
        return self

    def _proc(self, name: str, args: list[str]) -> ServiceProcess:
        self.procs[name] = ServiceProcess(args, self.env, name=name)
        return self.procs[name]

    def _ready(self) -> bool:
        try:
            return int(httpx.get(self.url("gateway") + "/health", timeout=2).json().get("models", 0)) >= 1
        except (httpx.HTTPError, ValueError):
            return False

    def url(self, name: str) -> str:
        return f"http://{self.procs[name].address}"

    def stats(self, name: str) -> dict[str, Any]:
        return httpx.get(self.url(name) + "/sim/stats", timeout=5).json()  # type: ignore[no-any-return]

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            proc.kill()


@pytest.fixture
def stack(database_url: str) -> Iterator[HookStack]:
    made = HookStack(database_url)
    try:
        yield made.start()
    finally:
        made.stop()


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
    # P's hook planned both turns from its own token ids: no pull on the first (COLD, or computed
    # locally when its plan came after its wait: the first plan also connects the channel), a PULL
    # on the second, and P pulled D's blocks.
    first_plan = sum(p["hook"].get(k, 0) for k in ("plan_cold", "plan_recompute", "fallback_wait_over",
                                                    "fallback_deadline_exceeded"))
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
