"""What the campaign runs and breaks: two replicas of every service, two prefill and two decode
simulated engines, on a highly available Postgres (ha_postgres.py).

Replica `a` of each service calls replica `a` of the next (gateway-a → router-a → registry-a, and
likewise `b`); engines 0 register with registry-a, engines 1 with registry-b. Every process keeps
its port for the whole run, so a process killed and started again is found where it was. An
engine started again gets a new engine id, as a restarted vLLM does (its blocks are gone), and
writes what it pulls, loads and retains to its ledger file (`sim --ledger`) as it happens.

Processes are started from the main thread only (lifeline.py arms only those to die with us).
"""

from __future__ import annotations

import signal
import uuid
from dataclasses import dataclass
from pathlib import Path

from boomerang_server.db import upgrade

from boomerang_tools.stack.children import Child, stop_all
from boomerang_tools.stack.ha_postgres import HaPostgres
from boomerang_tools.stack.postgres import free_port
from boomerang_tools.stack.stack import sim_tokenizers, tokenizers_env

PROFILE = "qwen3-32b"
REPLICAS = ("a", "b")
SERVICES = ("registry", "router", "reaper", "gateway")
ENGINES = ("prefill-0", "prefill-1", "decode-0", "decode-1")
WAVES = {"gateway": 2, "router": 1, "reaper": 1, "sim": 1, "registry": 0}


@dataclass
class Proc:
    """One process of the campaign, by name (`router-a`, `sim-decode-1`), across its restarts."""

    name: str
    kind: str  # registry, router, reaper, gateway or sim
    port: int
    side_port: int = 0  # an engine's side channel
    child: Child | None = None

    @property
    def address(self) -> str:
        """Where it listens."""
        return f"127.0.0.1:{self.port}"


class Cluster:
    """The processes and the HA Postgres; `start`, `restart(proc)`, `stop`."""

    def __init__(self, folder: Path, synchronous: bool, time_scale: float = 0.05):
        self.folder = folder
        self.log_dir = folder / "logs"
        self.ha = HaPostgres(3, synchronous)
        self.time_scale = time_scale
        self.procs: dict[str, Proc] = {}
        for x in REPLICAS:
            for kind in SERVICES:
                self.procs[f"{kind}-{x}"] = Proc(f"{kind}-{x}", kind, free_port())
        for engine in ENGINES:
            self.procs[f"sim-{engine}"] = Proc(f"sim-{engine}", "sim", free_port(), free_port())
        self.database_url = ""

    @property
    def gateways(self) -> list[Proc]:
        """The gateway replicas."""
        return [self.procs[f"gateway-{x}"] for x in REPLICAS]

    def ledger(self, proc: Proc) -> Path:
        """An engine's ledger file."""
        return self.folder / f"{proc.name}.ledger"

    def _env(self, proc: Proc) -> dict[str, str]:
        env = {
            "BOOMERANG_DATABASE_URL": self.database_url,
            "BOOMERANG_MIGRATE_ON_START": "false",
            "BOOMERANG_DRAIN_DELAY_SECONDS": "0.2",
            "BOOMERANG_GRACE_SECONDS": "3",
            "BOOMERANG_DB_POOL_SIZE": "4",
            "BOOMERANG_ENGINE_REFRESH_SECONDS": "0.5",
            # Each router spools its audit rows while Postgres is away, and replays them after.
            "BOOMERANG_AUDIT_SPOOL_DIR": str(self.folder / f"spool-{proc.name}"),
            # The engines run at `time_scale` of the model's time, but a pull's HTTP and copy work
            # does not shrink with it, so the times they report would teach the router that
            # recomputing is cheaper (half of all turns planned RECOMPUTE). Without a hook to
            # release them, the turns those plans leave unread stay pinned on D for vLLM's 480 s
            # and fill its pool. Plans use the configured costs, as on engines not yet measured.
            "BOOMERANG_TTFT_LEARNING_TURNS": "0",
            # The conversations are a few hundred tokens: over the default prefill floor (one
            # forward pass of Qwen3-32B on an H200) a pull of them saves nothing, and the
            # campaign is about pulls under faults. Its engines model no floor.
            "BOOMERANG_TTFT_PREFILL_FLOOR_MS": "0",
        }
        if proc.kind == "gateway":
            env.update(tokenizers_env(sim_tokenizers({PROFILE}, [])))
        return env

    def _args(self, proc: Proc) -> list[str]:
        x = proc.name.rsplit("-", 1)[1]
        listen = ["--listen", proc.address]
        if proc.kind == "registry":
            return ["registry", *listen]
        if proc.kind == "router":
            return ["router", *listen, "--registry", self.procs[f"registry-{x}"].address]
        if proc.kind == "reaper":
            return ["reaper", *listen, "--registry", self.procs[f"registry-{x}"].address, "--replica-id", proc.name]
        if proc.kind == "gateway":
            return ["gateway", *listen, "--router", self.procs[f"router-{x}"].address,
                    "--registry", self.procs[f"registry-{x}"].address, "--allow-anonymous"]
        role, n = proc.name.removeprefix("sim-").split("-")
        engine_id = f"chaos-{role}-{n}-{uuid.uuid4().hex[:6]}"  # new at each start
        registry = self.procs[f"registry-{REPLICAS[int(n)]}"].address
        return ["sim", "--role", role, "--port", str(proc.port), "--side-channel-port", str(proc.side_port),
                "--profile", PROFILE, "--registry", registry, "--heartbeat-seconds", "1", "--engine-id", engine_id,
                "--time-scale", str(self.time_scale), "--ledger", str(self.ledger(proc))]

    def spawn(self, proc: Proc) -> Child:
        """Start a process (does not wait until it is ready); from the main thread."""
        child = Child(proc.name, self._args(proc), self.log_dir, self._env(proc), WAVES[proc.kind],
                      "" if proc.kind == "sim" else f"{proc.kind} stopped", proc.kind == "sim")
        child.start()
        proc.child = child
        return child

    def start(self) -> None:
        """The HA Postgres and its schema, then every process in dependency order."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.database_url = self.ha.start()
        upgrade(self.database_url)
        for kinds in (("registry",), ("sim",), ("router", "reaper"), ("gateway",)):
            started = [self.spawn(p) for p in self.procs.values() if p.kind in kinds]
            for child in started:
                child.wait_ready(120)

    def stop(self) -> None:
        """Stop every process (waves, as `boomerang up` does), then the HA Postgres."""
        children = [p.child for p in self.procs.values() if p.child is not None]
        for child in children:
            child.signal(signal.SIGCONT)  # a stopped process cannot drain
        try:
            stop_all(children, timeout=10)
        finally:
            self.ha.stop()
