"""The vLLM hook's end-to-end stack: registry, router, two simulated engines running the hook
(`boomerang sim --hook`) and a gateway in engine-hook mode, all real processes on free ports."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx

from tests.support.procs import ServiceProcess, wait_for


class HookStack:
    """Registry, router, two hooked simulated engines and a gateway in engine-hook mode."""

    def __init__(self, database_url: str):
        self.env = {"BOOMERANG_DATABASE_URL": database_url, "BOOMERANG_CLAIM_DEADLINE_MS": "2000",
                    "BOOMERANG_ENGINE_REFRESH_SECONDS": "0.2", "BOOMERANG_DRAIN_DELAY_SECONDS": "0"}
        self.procs: dict[str, ServiceProcess] = {}

    def start(self) -> HookStack:
        registry = self._proc("registry", ["registry", "--listen", "127.0.0.1:0"]).start().address
        router = self._proc("router", ["router", "--listen", "127.0.0.1:0", "--registry", registry,
                                       "--engine-refresh-seconds", "0.2"]).start().address
        common = ["sim", "--port", "0", "--hook", "--registry", registry, "--heartbeat-seconds", "0.5",
                  "--time-scale", "0.01"]
        # A request waits for its plan up to the whole plan deadline (1 s): these tests are about
        # what the plans do, and a busy machine must not turn them into local computes. At the
        # profile's own prefill cost (0.02 ms a token) a 700-token prompt would wait only 14 ms,
        # which a host at load 15 overran (a later turn came out "wait over" and computed).
        sims = [self._proc("prefill", [*common, "--role", "prefill", "--router", router, "--plan-deadline-ms", "1000",
                                       "--plan-wait-share", "1", "--prefill-ms-per-token", "1000"]),
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


@contextmanager
def running_hook_stack(database_url: str) -> Iterator[HookStack]:
    """A started `HookStack` on `database_url`, stopped when the block ends (however it ends)."""
    stack = HookStack(database_url)
    try:
        yield stack.start()
    finally:
        stack.stop()
