"""Boomerang may lose a reuse, never a request: the router and then the registry are SIGKILLed
while conversations are in flight; every request still succeeds (as a plain prefill→decode
turn), nothing corrupt is pulled, and reuse comes back when they do."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.databases import fresh_database
from tests.support.gateway_stack import MODEL, GatewayStack
from tests.support.procs import ServiceProcess

pytestmark = pytest.mark.e2e
CONVERSATIONS = 16


@pytest.fixture
def stack() -> Iterator[GatewayStack]:
    with fresh_database() as url:
        s = GatewayStack(url)
        # Fail fast while a service is down: the gateway waits at most 0.6 s for a plan.
        s.env.update({"BOOMERANG_PLAN_TIMEOUT_SECONDS": "0.6", "BOOMERANG_CONTROL_PLANE_BACKOFF_SECONDS": "0.3"})
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
        self.plan_ids: list[str] = []  # of every turn the router planned

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
            if resp.headers.get("x-boomerang-plan-id"):
                self.plan_ids.append(resp.headers["x-boomerang-plan-id"])
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
        assert convs.plans("healthy").count("PULL") == 2 * CONVERSATIONS, convs.results

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

        # Both come back on their old addresses; reuse resumes within a few turns.
        for proc in (registry, router):
            args = [a if a != "127.0.0.1:0" else proc.address for a in proc.args]
            stack.procs[proc.name] = await asyncio.to_thread(ServiceProcess(args, stack.env, name=proc.name).start)
        steps = 0
        while steps < 12:
            await asyncio.sleep(0.5)
            await convs.step(http, "recovered")
            steps += 1
            if convs.plans("recovered")[-CONVERSATIONS:].count("PULL") >= CONVERSATIONS // 2:
                break
    assert all(status == 200 for _, status, _, _ in convs.results)
    assert len(convs.results) == (8 + steps) * CONVERSATIONS
    recovered = [r for r in convs.results if r[0] == "recovered"][-CONVERSATIONS:]
    assert [plan for _, _, plan, _ in recovered].count("PULL") >= CONVERSATIONS // 2, (
        recovered, stack.procs["gateway"].output()[-2500:], stack.procs["router"].output()[-2500:])
    assert stack.unsafe() == 0


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_engines_that_died_unannounced_cost_no_request() -> None:
    """A crashed engine stays registered (heartbeat still fresh) until the reaper notices: the
    gateway tries it, is refused, and serves the turn on a live engine."""
    with fresh_database() as url:
        env = {"BOOMERANG_DATABASE_URL": url, "BOOMERANG_MIGRATE_ON_START": "false", "BOOMERANG_DB_POOL_SIZE": "3",
               "BOOMERANG_ENGINE_REFRESH_SECONDS": "0.2"}
        procs = [ServiceProcess(["registry", "--listen", "127.0.0.1:0"], env).start()]
        try:
            registry = procs[0].address
            for role in ("prefill", "decode"):
                procs.append(ServiceProcess(["sim", "--role", role, "--port", "0", "--registry", registry,
                                             "--time-scale", "0"], env).start())
            asyncio.run(_register_crashed_engines(registry))
            gw = ServiceProcess(["gateway", "--listen", "127.0.0.1:0", "--router", "", "--registry", registry,
                                 "--allow-anonymous"], env).start()
            procs.append(gw)
            with httpx.Client(base_url=f"http://{gw.address}", timeout=30) as http:
                for _ in range(100):
                    if http.get("/health").json().get("models"):
                        break
                    time.sleep(0.1)
                for i in range(8):
                    resp = http.post("/v1/chat/completions", json={
                        "model": MODEL, "messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 4})
                    assert resp.status_code == 200, resp.text
                metrics = http.get("/metrics").text
            for role in ("prefill", "decode"):
                assert f'boomerang_gateway_engine_errors_total{{kind="ConnectError",role="{role}"}}' in metrics, metrics
        finally:
            for proc in reversed(procs):
                proc.kill()


async def _register_crashed_engines(registry: str) -> None:
    """A prefill and a decode engine whose HTTP and side-channel ports nobody listens on."""
    from boomerang.clients.registry import RegistryClient
    from boomerang.v1 import registry_service_pb2 as rpb
    from boomerang.v1 import types_pb2 as tpb

    async with RegistryClient(registry, timeout=5) as client:
        for role in (tpb.ENGINE_ROLE_PREFILL, tpb.ENGINE_ROLE_DECODE):
            port = _closed_port()
            await client.register_engine(rpb.RegisterEngineRequest(engine=tpb.Engine(
                engine_id=f"crashed-{role}-{uuid.uuid4().hex[:6]}", role=role, model=MODEL,
                side_channel_host="127.0.0.1", side_channel_port=port, http_base_url=f"http://127.0.0.1:{port}",
                registration_generation=1, kv_blocks_ttl_seconds=480, block_size=16)))
