"""A whole Boomerang as processes for end-to-end tests: registry, a simulated 1P1D pair,
router, reaper and gateway, all on free ports, sharing one environment.

The sims run at time scale 0 (no simulated delays) and register with the registry; the
router and the gateway find them there. They serve a model name of their own, so engines
other tests left in the same database are never chosen.
"""

from __future__ import annotations

import signal
import time
import uuid
from typing import Any

import grpc
import httpx
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import registry_service_pb2_grpc as rgrpc

from tests.support.procs import ServiceProcess

PROFILE_MODEL = "Qwen/Qwen3-32B"


class MiniStack:
    """Start with `start()`, stop with `stop()` (kills whatever is still running)."""

    def __init__(self, database_url: str, env: dict[str, str] | None = None, reaper: bool = False):
        self.env = {
            "BOOMERANG_DATABASE_URL": database_url,
            "BOOMERANG_MIGRATE_ON_START": "false",
            "BOOMERANG_DRAIN_DELAY_SECONDS": "0",
            **(env or {}),
        }
        self.with_reaper = reaper
        self.procs: dict[str, ServiceProcess] = {}
        self.run = uuid.uuid4().hex[:6]
        self.model = f"{PROFILE_MODEL}-{self.run}"

    def _start(self, name: str, args: list[str], extra: dict[str, str] | None = None) -> ServiceProcess:
        proc = ServiceProcess(args, {**self.env, **(extra or {})}, name=name)
        self.procs[name] = proc
        return proc.start()

    def start(self, metrics: bool = False) -> MiniStack:
        """Start every process; with `metrics`, gRPC services serve /metrics on free ports."""
        def m() -> list[str]:
            return ["--metrics-listen", "127.0.0.1:0"] if metrics else []

        try:
            registry = self._start("registry", ["registry", "--listen", "127.0.0.1:0", *m()])
            for role in ("prefill", "decode"):
                self._start(f"sim-{role}", [
                    "sim", "--role", role, "--port", "0", "--engine-id", f"sim-{role}-{self.run}",
                    "--registry", registry.address, "--heartbeat-seconds", "0.5", "--time-scale", "0",
                    "--served-model-name", self.model,
                ])
            self._start("router", ["router", "--listen", "127.0.0.1:0", "--registry", registry.address,
                                   "--engine-refresh-seconds", "0.2", *m()],
                        # A loaded test box must not turn a claim into CONTROL_PLANE_DEGRADED.
                        {"BOOMERANG_CLAIM_DEADLINE_MS": "2000"})
            if self.with_reaper:
                self._start("reaper", ["reaper", "--listen", "127.0.0.1:0", "--registry", registry.address, *m()])
            self._start("gateway", ["gateway", "--listen", "127.0.0.1:0", "--router", self.procs["router"].address,
                                    "--registry", registry.address, "--allow-anonymous"],
                        {"BOOMERANG_ENGINE_REFRESH_SECONDS": "0.2"})
            self._wait_models()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_models(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                data = httpx.get(self.gateway_url + "/v1/models", timeout=2).json().get("data", [])
                if any(card.get("id") == self.model for card in data):
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.1)
        raise RuntimeError("the gateway never saw the simulated engines:\n" + self.procs["gateway"].output())

    @property
    def gateway_url(self) -> str:
        """The gateway's base URL."""
        return f"http://{self.procs['gateway'].address}"

    def address(self, name: str) -> str:
        """HOST:PORT of a process."""
        return self.procs[name].address

    def metrics_address(self, name: str) -> str:
        """HOST:PORT of a gRPC service's /metrics (started with `metrics=True`)."""
        for line in self.procs[name].lines:
            if line.startswith("BOOMERANG_METRICS"):
                return line.split()[-1]
        raise AssertionError(f"{name} printed no BOOMERANG_METRICS line")

    def stop(self) -> None:
        """SIGTERM everything at once, wait, then SIGKILL what lingers."""
        for proc in self.procs.values():
            if proc.alive():
                assert proc.proc is not None
                proc.proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.terminate(timeout=15)
            except Exception:  # noqa: BLE001 - fall back to SIGKILL
                proc.kill()


def user_turns(n: int, words: int = 120) -> list[str]:
    """`n` long user messages (long enough that the previous turn's blocks pay to pull)."""
    return [" ".join(f"turn{i}-word{j}" for j in range(words)) for i in range(n)]


def chat(base_url: str, model: str, conversation: str, messages: list[dict[str, Any]],
         headers: dict[str, str] | None = None, max_tokens: int = 16) -> httpx.Response:
    """One non-streaming chat turn through the gateway."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "conversation_id": conversation}
    return httpx.post(base_url + "/v1/chat/completions", json=body, headers=headers or {}, timeout=30)


def wait_retained(registry: str, tenant: str, conversation: str, leases: int, timeout: float = 10.0) -> None:
    """Wait until the conversation has `leases` leases (ReportTurn runs after the response)."""
    with grpc.insecure_channel(registry) as channel:
        stub = rgrpc.BlockRegistryServiceStub(channel)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                got = stub.GetConversation(rpb.GetConversationRequest(tenant=tenant, conversation_id=conversation), timeout=2)
                if len(got.leases) >= leases:
                    return
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.NOT_FOUND:
                    raise
            time.sleep(0.05)
    raise AssertionError(f"conversation {conversation} never reached {leases} lease(s)")


def converse(stack: MiniStack, conversation: str, turns: int, headers_for: Any = None,
             tenant: str = "anonymous") -> list[httpx.Response]:
    """`turns` turns of one conversation, each resending the whole history and waiting for
    the previous turn's blocks to be registered (so the next turn can pull them)."""
    messages: list[dict[str, Any]] = []
    out = []
    for i, text in enumerate(user_turns(turns)):
        messages.append({"role": "user", "content": text})
        resp = chat(stack.gateway_url, stack.model, conversation, messages, headers_for(i) if headers_for else None)
        resp.raise_for_status()
        out.append(resp)
        messages.append({"role": "assistant", "content": resp.json()["choices"][0]["message"]["content"]})
        wait_retained(stack.address("registry"), tenant, conversation, i + 1)
    return out
