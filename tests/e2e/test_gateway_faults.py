"""Boomerang may lose a reuse, never a request: the router and then the registry are SIGKILLed
while conversations are in flight; every request still succeeds (as a plain prefill→decode
turn), nothing corrupt is pulled, and reuse comes back when they do."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.gateway_stack import MODEL, GatewayStack
from tests.support.procs import ServiceProcess

pytestmark = pytest.mark.e2e
CONVERSATIONS = 16


@pytest.fixture
def stack(database_url: str) -> Iterator[GatewayStack]:
    s = GatewayStack(database_url)
    # Fail fast while a service is down: a short claim deadline and plan deadline.
    s.env.update({"BOOMERANG_CLAIM_DEADLINE_MS": "300", "BOOMERANG_PLAN_TIMEOUT_SECONDS": "0.6",
                  "BOOMERANG_CONTROL_PLANE_BACKOFF_SECONDS": "0.3"})
    s.start()
    yield s
    s.stop()


class Conversations:
    """Conversations that each send one turn per `step()`; every response is recorded."""

    def __init__(self, url: str, key: str):
        self.url, self.key = url, key
        self.histories = [[{"role": "system", "content": f"Agent {n}. " + "Plan, read, edit, test. " * 40}]
                          for n in range(CONVERSATIONS)]
        self.ids = [f"fault-{n}-{uuid.uuid4().hex[:6]}" for n in range(CONVERSATIONS)]
        self.results: list[tuple[str, int, str, str]] = []  # phase, status, plan, reason

    async def step(self, http: httpx.AsyncClient, phase: str) -> None:
        async def one(n: int) -> None:
            history = self.histories[n]
            history.append({"role": "user", "content": f"Turn {len(history)}: " + "look at the next file. " * 12})
            resp = await http.post(self.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {self.key}"},
                                   json={"model": MODEL, "messages": history, "max_tokens": 16,
                                         "conversation_id": self.ids[n]})
            body: dict[str, Any] = resp.json()
            self.results.append((phase, resp.status_code, resp.headers.get("x-boomerang-plan", ""),
                                 resp.headers.get("x-boomerang-reason", "")))
            assert resp.status_code == 200, (phase, body)
            history.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})

        await asyncio.gather(*(one(n) for n in range(CONVERSATIONS)))

    def plans(self, phase: str) -> list[str]:
        return [plan for p, _, plan, _ in self.results if p == phase]


async def _kill_soon(proc: ServiceProcess, delay: float) -> None:
    await asyncio.sleep(delay)
    await asyncio.to_thread(proc.kill)


async def test_router_then_registry_killed_mid_run_every_request_succeeds(stack: GatewayStack) -> None:
    key = await asyncio.to_thread(stack.create_tenant, f"faults-{uuid.uuid4().hex[:6]}")
    convs = Conversations(stack.gateway_url, key)
    router, registry = stack.procs["router"], stack.procs["registry"]
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=64)) as http:
        for _ in range(3):
            await convs.step(http, "healthy")
        assert convs.plans("healthy").count("PULL") == 2 * CONVERSATIONS

        # The router dies while turns are in flight.
        await asyncio.gather(convs.step(http, "router-dying"), _kill_soon(router, 0.02))
        for _ in range(2):
            await convs.step(http, "router-dead")
        # Then the registry too.
        await asyncio.gather(convs.step(http, "registry-dying"), _kill_soon(registry, 0.02))
        await convs.step(http, "all-dead")
        assert set(convs.plans("router-dead")) == {"RECOMPUTE"}
        assert set(convs.plans("all-dead")) == {"RECOMPUTE"}
        reasons = {r for p, _, _, r in convs.results if p in ("router-dead", "all-dead")}
        assert reasons == {"CONTROL_PLANE_DEGRADED"}

        # Both come back on their old addresses (the router with a roomier claim deadline,
        # as it warms up on a busy test box); reuse resumes within a few turns.
        env = {**stack.env, "BOOMERANG_CLAIM_DEADLINE_MS": "2000"}
        for proc in (registry, router):
            args = [a if a != "127.0.0.1:0" else proc.address for a in proc.args]
            stack.procs[proc.name] = await asyncio.to_thread(ServiceProcess(args, env, name=proc.name).start)
        steps = 0
        while steps < 6:
            await asyncio.sleep(0.5)
            await convs.step(http, "recovered")
            steps += 1
            if convs.plans("recovered")[-CONVERSATIONS:].count("PULL") >= CONVERSATIONS // 2:
                break
    assert all(status == 200 for _, status, _, _ in convs.results)
    assert len(convs.results) == (8 + steps) * CONVERSATIONS
    recovered = [r for r in convs.results if r[0] == "recovered"][-CONVERSATIONS:]
    assert [plan for _, _, plan, _ in recovered].count("PULL") >= CONVERSATIONS // 2, recovered
    assert stack.unsafe() == 0
