"""Gateway-only engines (no hook, no heartbeats of their own) stay alive while they answer the
gateway's health checks, and a stopped one is still judged dead.

Simulated engines without `--registry` stand in for vLLM without the hook: the router learns
the decode engine from its returned handle, and nothing else heartbeats for it. The reaper's
engine-heartbeat timeout is 3 s; the conversation is idle for 2.5 times that.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from boomerang.clients.registry import RegistryClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb

from tests.support.databases import fresh_database
from tests.support.ministack import chat, user_turns, wait_retained
from tests.support.procs import ServiceProcess

pytestmark = pytest.mark.e2e

MODEL = "Qwen/Qwen3-32B"
REAPER_TIMEOUT = 3.0


class Stack:
    def __init__(self, database_url: str):
        self.env = {"BOOMERANG_DATABASE_URL": database_url, "BOOMERANG_MIGRATE_ON_START": "false",
                    "BOOMERANG_DRAIN_DELAY_SECONDS": "0", "BOOMERANG_CLAIM_DEADLINE_MS": "2000",
                    "BOOMERANG_PLAN_TIMEOUT_SECONDS": "3"}
        self.run = uuid.uuid4().hex[:6]
        self.decode_id = f"hookless-d-{self.run}"
        self.procs: dict[str, ServiceProcess] = {}

    def start(self, name: str, args: list[str], extra: dict[str, str] | None = None) -> ServiceProcess:
        proc = ServiceProcess(args, {**self.env, **(extra or {})}, name=name)
        self.procs[name] = proc
        return proc.start()

    def up(self) -> Stack:
        registry = self.start("registry", ["registry", "--listen", "127.0.0.1:0"]).address
        prefill = self.start("sim-prefill", ["sim", "--role", "prefill", "--port", "0", "--time-scale", "0",
                                             "--engine-id", f"hookless-p-{self.run}"]).address
        decode = self.start("sim-decode", ["sim", "--role", "decode", "--port", "0", "--time-scale", "0",
                                           "--engine-id", self.decode_id]).address
        static = ["--prefill", f"http://{prefill}", "--decode", f"http://{decode}"]
        self.start("reaper", ["reaper", "--listen", "127.0.0.1:0", "--registry", registry,
                              "--engine-heartbeat-timeout-seconds", str(REAPER_TIMEOUT),
                              "--engine-sweep-interval-seconds", "0.2", "--leader-lease-seconds", "2"])
        router = self.start("router", ["router", "--listen", "127.0.0.1:0", "--registry", registry, *static,
                                       "--engine-refresh-seconds", "0.2", "--heartbeat-timeout-seconds", "1.5"]).address
        self.start("gateway", ["gateway", "--listen", "127.0.0.1:0", "--router", router, "--registry", registry,
                               *static, "--allow-anonymous"],
                   {"BOOMERANG_ENGINE_REFRESH_SECONDS": "0.2", "BOOMERANG_HEARTBEAT_TIMEOUT_SECONDS": "1.5"})
        return self

    @property
    def gateway(self) -> str:
        return f"http://{self.procs['gateway'].address}"

    def decode_engine(self) -> tpb.Engine | None:
        async def get() -> tpb.Engine | None:
            async with RegistryClient(self.procs["registry"].address) as rc:
                listed = await rc.list_engines(rpb.ListEnginesRequest())
            return next((e for e in listed.engines if e.engine_id == self.decode_id), None)

        return asyncio.run(get())

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            proc.kill()


@pytest.fixture
def stack() -> Iterator[Stack]:
    # A database of its own: a 3 s engine timeout must not judge other tests' engines.
    with fresh_database() as url:
        s = Stack(url)
        try:
            yield s.up()
        finally:
            s.stop()


def turn(stack: Stack, conversation: str, messages: list[dict[str, Any]], text: str) -> Any:
    messages.append({"role": "user", "content": text})
    resp = chat(stack.gateway, MODEL, conversation, messages)
    assert resp.status_code == 200, resp.text
    messages.append({"role": "assistant", "content": resp.json()["choices"][0]["message"]["content"]})
    return resp


def test_idle_gateway_only_engines_keep_their_leases_and_a_stopped_one_dies(stack: Stack) -> None:
    conversation, messages = f"idle-{stack.run}", []  # type: ignore[var-annotated]
    texts = user_turns(3)
    first = turn(stack, conversation, messages, texts[0])
    assert first.headers["x-boomerang-plan"] == "COLD", first.headers
    wait_retained(stack.procs["registry"].address, "anonymous", conversation, 1)
    registered = stack.decode_engine()
    assert registered is not None and registered.status == tpb.ENGINE_STATUS_ACTIVE  # from its handle

    time.sleep(2.5 * REAPER_TIMEOUT)  # idle: no turn, and the engine never heartbeats itself
    alive = stack.decode_engine()
    assert alive is not None and alive.status == tpb.ENGINE_STATUS_ACTIVE, stack.procs["reaper"].output()
    assert alive.heartbeat_time.ToSeconds() > registered.heartbeat_time.ToSeconds()  # the gateway's heartbeats
    second = turn(stack, conversation, messages, texts[1])
    assert second.headers["x-boomerang-plan"] == "PULL", (second.headers, stack.procs["router"].output())

    wait_retained(stack.procs["registry"].address, "anonymous", conversation, 2)
    stack.procs["sim-decode"].kill()  # stopped: its health checks fail, nobody vouches for it
    deadline = time.monotonic() + 6 * REAPER_TIMEOUT
    engine = stack.decode_engine()
    while engine is not None and engine.status == tpb.ENGINE_STATUS_ACTIVE and time.monotonic() < deadline:
        time.sleep(0.2)
        engine = stack.decode_engine()
    assert engine is not None and engine.status == tpb.ENGINE_STATUS_DEAD, stack.procs["reaper"].output()
