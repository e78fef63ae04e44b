"""A deployment without Boomerang's control plane, for the demo's alternative to Boomerang.

What an operator runs who answers "why not prefix caching on P with sticky routing?": the
engines (here simulated, with the mode's engine flags, e.g. a prefix cache) and a proxy that
sends each conversation to the same prefill engine — the Boomerang gateway with no router
(`--router ''`) and `--sticky-prefill`, its engines named statically. No database, registry,
router or reaper: nothing plans, registers or retains KV across engines.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from boomerang_tools.stack.children import Child, ChildFailed, stop_all
from boomerang_tools.stack.stack import sim_tokenizers, tokenizers_env


class PlainStack:
    """Simulated engines and a gateway in front of them, started and stopped as `Stack` is."""

    def __init__(self, data_dir: Path, profiles: list[str], sim_args: list[str], gateway_args: list[str],
                 log_level: str = "WARNING"):
        self.log_dir = data_dir / "logs"
        self.profiles = profiles
        self.sim_args = sim_args
        self.gateway_args = gateway_args
        self.env = {"BOOMERANG_DATABASE_URL": "", "BOOMERANG_LOG_LEVEL": log_level,
                    "BOOMERANG_DRAIN_DELAY_SECONDS": "0.2", "BOOMERANG_GRACE_SECONDS": "5"}
        self.children: list[Child] = []
        self.prefill_urls: list[str] = []  # per profile, in order
        self.decode_urls: list[str] = []
        self.gateway_url = ""
        self.registry_address = self.router_address = ""  # none: no audit trail from this deployment

    def _spawn(self, name: str, args: list[str], wave: int, env: dict[str, str] | None = None) -> Child:
        child = Child(f"plain-{name}", args, self.log_dir, {**self.env, **(env or {})}, wave,
                      "" if args[0] == "sim" else "gateway stopped", args[0] == "sim")
        child.start()
        self.children.append(child)
        return child

    def start(self) -> None:
        """Start the engines, then the gateway; on any failure stop what started and raise."""
        try:
            sims = [(role, self._spawn(f"sim-{role}-{i}", ["sim", "--role", role, "--port", "0", "--profile", p,
                                                            *self.sim_args], 0))
                    for i, p in enumerate(self.profiles) for role in ("prefill", "decode")]
            for role, child in sims:
                (self.prefill_urls if role == "prefill" else self.decode_urls).append(f"http://{child.wait_ready()}")
            static = [a for u in self.prefill_urls for a in ("--prefill", u)]
            static += [a for u in self.decode_urls for a in ("--decode", u)]
            gateway = self._spawn("gateway", ["gateway", "--listen", "127.0.0.1:0", "--allow-anonymous", *static,
                                              *self.gateway_args], 1,
                                  tokenizers_env(sim_tokenizers(self.profiles, self.sim_args)))
            self.gateway_url = f"http://{gateway.wait_ready()}"
            self._wait_models()
        except BaseException:
            self.stop()
            raise

    def _wait_models(self, timeout: float = 30.0) -> None:
        """Wait until the gateway has read every engine's models."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                health = httpx.get(self.gateway_url + "/health", timeout=2.0).json()
                if int(health.get("models", 0)) >= len(self.profiles):
                    return
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise ChildFailed(f"the gateway did not see the engines' models within {timeout:.0f}s")
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop the gateway, then the engines."""
        try:
            stop_all(self.children)
        finally:
            self.children = []
