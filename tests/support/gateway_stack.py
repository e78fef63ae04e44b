"""The gateway's end-to-end stack: registry, router, two simulated P/D pairs and the gateway,
all real processes on free ports, on a database of their own (`running_stack`).

Pair `MODEL` is a plain Qwen3-32B; pair `THINKING` (`--strip-reasoning`) is a Qwen3 thinking
model whose chat template drops earlier turns' reasoning. Engines register with the
registry; the router and the gateway find them there. API keys are made with the real
`boomerang tenants create`.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai

from tests.support.databases import fresh_database
from tests.support.procs import ServiceProcess

MODEL = "Qwen/Qwen3-32B"
THINKING = "qwen3-thinking"
BOOMERANG = str(Path(sys.executable).with_name("boomerang"))


class GatewayStack:
    """Start with `start()`, stop with `stop()`."""

    def __init__(self, database_url: str, time_scale: float = 0.0, gateway_args: list[str] | None = None,
                 control_plane: bool = False, gateway_env: dict[str, str] | None = None):
        """`control_plane`: the registry and the router as one `boomerang control-plane` process;
        `gateway_env` (with it): the gateway in that process too, with these settings."""
        self.database_url = database_url
        self.env = {
            "BOOMERANG_DATABASE_URL": database_url,
            "BOOMERANG_MIGRATE_ON_START": "false",
            "BOOMERANG_DRAIN_DELAY_SECONDS": "0",
            "BOOMERANG_GRACE_SECONDS": "3",
            # The test box runs every process on two cores; a claim must not degrade for that.
            "BOOMERANG_CLAIM_DEADLINE_MS": "2000",
            "BOOMERANG_ENGINE_REFRESH_SECONDS": "0.2",
            "BOOMERANG_PLAN_TIMEOUT_SECONDS": "3",
            # Nor a turn go COLD because its /tokenize took over the default second on a busy box.
            "BOOMERANG_TOKENIZE_TIMEOUT_SECONDS": "10",
            # Small pools: the test Postgres is shared by every test session on the machine.
            "BOOMERANG_DB_POOL_SIZE": "3",
        }
        self.time_scale = time_scale
        self.gateway_args = gateway_args or []
        self.control_plane = control_plane
        self.gateway_env = gateway_env
        self.procs: dict[str, ServiceProcess] = {}
        self.run = uuid.uuid4().hex[:6]

    def _proc(self, name: str, args: list[str]) -> ServiceProcess:
        proc = ServiceProcess(args, self.env, name=name)
        self.procs[name] = proc
        return proc

    def _sim(self, role: str, model: str) -> ServiceProcess:
        args = ["sim", "--role", role, "--port", "0", "--engine-id", f"sim-{role}-{model[:5]}-{self.run}",
                "--registry", self.procs["registry"].address, "--heartbeat-seconds", "0.5",
                "--time-scale", str(self.time_scale)]
        if model == THINKING:
            args += ["--strip-reasoning", "--served-model-name", THINKING]
        return self._proc(f"sim-{role}-{model}", args)

    def start(self) -> GatewayStack:
        """Start everything and wait until the gateway serves both models."""
        try:
            if self.control_plane:
                gateway = ["--gateway-listen", "127.0.0.1:0"] if self.gateway_env is not None else []
                self.env.update(self.gateway_env or {})
                both = self._proc("control-plane", ["control-plane", "--listen", "127.0.0.1:0", *gateway]).start(
                    ready_name="control-plane")
                self.procs["registry"] = self.procs["router"] = both
            else:
                self._proc("registry", ["registry", "--listen", "127.0.0.1:0"]).start()
            registry = self.procs["registry"].address
            later = [self._sim(role, model) for model in (MODEL, THINKING) for role in ("prefill", "decode")]
            if not self.control_plane:
                later.append(self._proc("router", ["router", "--listen", "127.0.0.1:0", "--registry", registry,
                                                   "--engine-refresh-seconds", "0.2"]))
            with ThreadPoolExecutor(len(later)) as pool:
                list(pool.map(lambda p: p.start(), later))
            if self.gateway_env is None:
                self._proc("gateway", ["gateway", "--listen", "127.0.0.1:0", "--router", self.procs["router"].address,
                                       "--registry", registry, *self.gateway_args]).start()
            else:
                self.procs["gateway"] = self.procs["control-plane"]
            self.wait_models()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def gateway_url(self) -> str:
        """The gateway's base URL."""
        gateway = self.procs["gateway"]
        return f"http://{gateway.addresses.get('gateway', gateway.address)}"

    def sim_url(self, role: str, model: str = MODEL) -> str:
        """A simulated engine's base URL."""
        return f"http://{self.procs[f'sim-{role}-{model}'].address}"

    def stats(self, role: str = "prefill", model: str = MODEL) -> dict:  # type: ignore[type-arg]
        """A simulated engine's `/sim/stats`."""
        return httpx.get(self.sim_url(role, model) + "/sim/stats", timeout=5).json()  # type: ignore[no-any-return]

    def unsafe(self) -> int:
        """Corrupt pulls and reads of expired or freed blocks, over every engine."""
        total = 0
        for model in (MODEL, THINKING):
            for role in ("prefill", "decode"):
                s = self.stats(role, model)
                total += s["corrupt_pulls"] + s["expired_or_freed_reads"] + s["corrupt_loads"] + s["expired_or_freed_loads"]
        return total

    def create_tenant(self, name: str) -> str:
        """A new tenant's API key, made by the real CLI."""
        out = subprocess.run([BOOMERANG, "tenants", "create", name], capture_output=True, text=True, timeout=60,
                             env={**self.env, "PATH": "/usr/bin:/bin"})
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    def new_key(self, prefix: str) -> str:
        """The API key of a new tenant named `prefix` and a random suffix (unique per call)."""
        return self.create_tenant(f"{prefix}-{uuid.uuid4().hex[:8]}")

    def openai_client(self, api_key: str, **kwargs: Any) -> openai.AsyncOpenAI:
        """A stock OpenAI client on the gateway (`kwargs` as the client's): no retries, so a
        test sees every failure; a timeout only a hung request reaches on a loaded host."""
        return openai.AsyncOpenAI(base_url=self.gateway_url + "/v1", api_key=api_key, max_retries=0, timeout=120,
                                  **kwargs)

    def wait_models(self, timeout: float = 30.0) -> None:
        """Until the gateway lists both models and the router sees all four engines."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                health = httpx.get(self.gateway_url + "/health", timeout=2).json()
                if health.get("models", 0) >= 2 and self._router_engines() >= 4:
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.1)
        raise RuntimeError("the gateway never saw both models:\n" + self.procs["gateway"].output())

    def _router_engines(self) -> int:
        from boomerang.clients.router import RouterClient
        from boomerang.v1 import router_service_pb2 as rtpb

        async def count() -> int:
            async with RouterClient(self.procs["router"].address, timeout=2) as router:
                listed = await router.list_engines(rtpb.RouterServiceListEnginesRequest())
            return sum(1 for e in listed.engines if e.available)

        return asyncio.run(count())

    def stop(self) -> None:
        """Kill everything still running."""
        for proc in reversed(list(self.procs.values())):
            if proc.proc is not None:
                proc.kill()


@contextmanager
def running_stack() -> Iterator[GatewayStack]:
    """A started `GatewayStack` on a database of its own; stopped, and the database dropped,
    when the block ends."""
    with fresh_database("boomerang_gw") as url:
        stack = GatewayStack(url).start()
        try:
            yield stack
        finally:
            stack.stop()
