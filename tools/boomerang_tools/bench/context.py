"""A benchmark run's state: the database, the services, the engines and the client processes.

`runner.py` starts and measures one; `phases.py` and `overhead.py` measure over it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import asyncpg
from boomerang.clients.registry import RegistryClient
from boomerang.clients.router import RouterClient
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang_server.db import upgrade
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from boomerang_tools.bench.config import BenchConfig
from boomerang_tools.bench.database import BenchDatabase
from boomerang_tools.bench.loadgen import Workers
from boomerang_tools.bench.profiling import Sampler
from boomerang_tools.bench.services import BenchEngines, CpuMeter, Services
from boomerang_tools.bench.workload import MODEL
from boomerang_tools.sim import hfmodel

log = logging.getLogger(__name__)
TTL_MARGIN_SECONDS = 10.0  # the registry's default BOOMERANG_TTL_MARGIN_SECONDS


def _backends(database: str) -> list[int]:
    """Process ids of the Postgres backends connected to `database` (from /proc: no query, so
    it can run between awaits without a round trip)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if title.startswith(b"postgres: ") and f" {database} ".encode() in title:
            out.append(int(entry.name))
    return out


class CountColumn(ProgressColumn):
    """`done/total` for tasks with a total, nothing for open-ended ones."""

    def render(self, task: Task) -> Text:
        if task.total is None:
            return Text("")
        return Text(f"{task.completed:,.0f}/{task.total:,.0f}")


SIM_MODEL = "Qwen/Qwen3-32B"
# The gateway the `gateway` phase measures: anonymous tenants, and in-process tokenizing with
# the simulator's own model files, as it would with a real model's (P's /tokenize its fallback).
GATEWAY_ENV = {"BOOMERANG_ALLOW_ANONYMOUS": "true", "BOOMERANG_TOKENIZERS": f"{SIM_MODEL}={hfmodel.folder(thinking=False)}"}


class Bench:
    """Everything a run holds: the database, the services, the engines, the client processes."""

    def __init__(self, cfg: BenchConfig, database_url: str, data_dir: Path, console: Console, keep_database: bool):
        self.cfg = cfg
        self.console = console
        self.db = BenchDatabase(database_url, data_dir, keep=keep_database)
        self.log_dir = data_dir / "bench-logs"
        self.services: Services
        self.pg: asyncpg.Connection
        self.registry: RegistryClient
        self.engines: BenchEngines
        self.workers: Workers
        self.registry_address = ""
        self.router_address = ""
        self.gateway_url = ""  # the gateway phase's (its own process, or the control plane's)
        self.margin_seconds = TTL_MARGIN_SECONDS
        self.preloaded = 0
        self.copy_rows_per_second = 10_000.0
        self.step = 0
        self.memory: dict[str, dict[str, float]] = {}
        self.profile_dir: Path | None = None
        self.profiles: dict[str, object] = {}
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 CountColumn(), TimeElapsedColumn(),
                                 console=console, transient=True)

    def sample_memory(self) -> None:
        """Remember each service's resident memory (the peak is the kernel's high-water mark)."""
        for name, mem in self.services.memory().items():
            self.memory[name] = mem

    def sampler(self, label: str, names: tuple[str, ...], seconds: float) -> Sampler | None:
        """With `--profile`, py-spy on the named services for `seconds` (starting now)."""
        if self.profile_dir is None:
            return None
        pids = {n: c.proc.pid for n, c in self.services.children.items() if n in names and c.proc is not None}
        return Sampler(self.profile_dir, label, pids, seconds)

    async def cpu_meter(self, *names: str) -> CpuMeter:
        """A CPU meter over the named services, this database's Postgres backends and the clients."""
        pids = self.services.pids(*names)
        pids["postgres"] = backends = _backends(self.db.name)
        pids["clients"] = [p.pid for p in self.workers.procs if p.pid is not None]
        return CpuMeter(pids, {"postgres": lambda: _backends(self.db.name) + backends})

    async def collect(self, label: str, sampler: Sampler | None) -> None:
        """Keep what a sampler found under `label`."""
        if sampler is not None:
            self.profiles[label] = await asyncio.to_thread(sampler.finish)

    async def start(self) -> None:
        """Database, migrations, registry, router, reaper, engines, client processes."""
        for noisy in ("alembic", "httpx"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        url = await self.db.start()
        await asyncio.to_thread(upgrade, url)
        # The engines compute nothing (`--time-scale 0`), so the times they report teach the router
        # nothing about real hardware (it would learn that recomputing is free and plan RECOMPUTE):
        # plans use the configured costs, as on engines not yet measured.
        env = {"BOOMERANG_DATABASE_URL": url, "BOOMERANG_MIGRATE_ON_START": "false", "BOOMERANG_LOG_LEVEL": "INFO",
               "BOOMERANG_TTFT_LEARNING_TURNS": "0",
               "BOOMERANG_DRAIN_DELAY_SECONDS": "0.1", "BOOMERANG_GRACE_SECONDS": "3",
               "BOOMERANG_METRICS_LISTEN": ""}
        self.services = Services(self.log_dir, env)
        s = self.services
        metrics = {"BOOMERANG_METRICS_LISTEN": "127.0.0.1:0"}
        if self.cfg.control_plane:
            # One process, known by three names (its CPU counted once, as registry): the registry,
            # the router and the gateway the `gateway` phase measures (in-process calls).
            s.start("registry", ["control-plane", "--listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0"],
                    {**metrics, **GATEWAY_ENV})
            (self.registry_address,) = await s.ready("registry")
            s.children["router"] = s.children["gateway"] = s.children["registry"]
        else:
            s.start("registry", ["registry", "--listen", "127.0.0.1:0"], metrics)
            (self.registry_address,) = await s.ready("registry")
            s.start("router", ["router", "--listen", "127.0.0.1:0", "--registry", self.registry_address], metrics)
        s.start("reaper", ["reaper", "--listen", "127.0.0.1:0", "--registry", self.registry_address])
        self.registry = RegistryClient(self.registry_address, timeout=10.0)
        self.engines = BenchEngines(self.registry)
        await self.engines.register(self.cfg.decode_engines, self.cfg.prefill_engines)
        if self.cfg.control_plane:
            self.router_address = self.registry_address
            await s.ready("reaper")
        else:
            self.router_address, _ = await s.ready("router", "reaper")
        self.workers = await asyncio.to_thread(Workers, self.cfg.clients, self.router_address, self.registry_address)
        self.pg = await asyncpg.connect(url)
        await self._wait_pool(self.router_address)

    async def _wait_pool(self, address: str, timeout: float = 30.0) -> None:
        """Until the router at `address` holds the benchmark's engines in its pool (it polls the registry)."""
        want = self.cfg.decode_engines + self.cfg.prefill_engines
        deadline = time.monotonic() + timeout
        async with RouterClient(address, timeout=2.0) as router:
            while time.monotonic() < deadline:
                try:
                    listed = await router.list_engines(rtpb.RouterServiceListEnginesRequest(model=MODEL))
                    if sum(1 for e in listed.engines if e.available) >= want:
                        return
                except Exception:  # noqa: BLE001 - not yet
                    pass
                await asyncio.sleep(0.2)
        raise RuntimeError(f"the router at {address} did not see the benchmark's engines in time")

    async def stop(self) -> None:
        """Stop what started, in reverse."""
        for step in (lambda: self.workers.close(), lambda: self.services.stop()):
            try:
                await asyncio.to_thread(step)
            except AttributeError:
                pass  # never started
            except Exception:
                log.warning("stopping failed", exc_info=True)
        for closer in ("engines", "registry", "pg"):
            obj = getattr(self, closer, None)
            if obj is not None:
                try:
                    await (obj.stop() if closer == "engines" else obj.close())
                except Exception:
                    log.warning("closing %s failed", closer, exc_info=True)
        await self.db.stop()
