"""One benchmark run: start everything, measure in order, write the report, stop everything."""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any

import asyncpg
from boomerang.clients.registry import RegistryClient
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

from boomerang_tools.bench import overhead, phases
from boomerang_tools.bench.config import BenchConfig
from boomerang_tools.bench.database import BenchDatabase
from boomerang_tools.bench.loadgen import Workers
from boomerang_tools.bench.profiling import Sampler
from boomerang_tools.bench.report import build_report, write_report
from boomerang_tools.bench.services import BenchEngines, CpuMeter, Services

log = logging.getLogger(__name__)
TTL_MARGIN_SECONDS = 10.0  # the registry's default BOOMERANG_TTL_MARGIN_SECONDS


def machine() -> dict[str, Any]:
    """What the figures came from."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        mem_kb = next(int(x.split()[1]) for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal"))
    except (OSError, StopIteration):
        mem_kb = 0
    return {"cpus": os.cpu_count(), "cpu_model": model, "memory_gb": round(mem_kb / 1024 / 1024, 1),
            "python": platform.python_version(), "platform": platform.platform(), "load_avg_at_start": os.getloadavg()}


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
        for noisy in ("alembic", "httpx"):  # before the import: alembic logs its plugins then
            logging.getLogger(noisy).setLevel(logging.WARNING)
        from boomerang.db.migrate import upgrade

        url = await self.db.start()
        await asyncio.to_thread(upgrade, url)
        env = {"BOOMERANG_DATABASE_URL": url, "BOOMERANG_MIGRATE_ON_START": "false", "BOOMERANG_LOG_LEVEL": "INFO",
               "BOOMERANG_DRAIN_DELAY_SECONDS": "0.1", "BOOMERANG_GRACE_SECONDS": "3",
               "BOOMERANG_METRICS_LISTEN": ""}
        self.services = Services(self.log_dir, env)
        s = self.services
        s.start("registry", ["registry", "--listen", "127.0.0.1:0"])
        (self.registry_address,) = await s.ready("registry")
        s.start("router", ["router", "--listen", "127.0.0.1:0", "--registry", self.registry_address])
        s.start("reaper", ["reaper", "--listen", "127.0.0.1:0", "--registry", self.registry_address])
        self.registry = RegistryClient(self.registry_address, timeout=10.0)
        self.engines = BenchEngines(self.registry)
        await self.engines.register(self.cfg.decode_engines, self.cfg.prefill_engines)
        self.router_address, _ = await s.ready("router", "reaper")
        self.workers = await asyncio.to_thread(Workers, self.cfg.clients, self.router_address, self.registry_address)
        self.pg = await asyncpg.connect(url)
        await self._wait_pool()

    async def _wait_pool(self, timeout: float = 30.0) -> None:
        """Until the router's pool holds the benchmark's engines (it polls the registry)."""
        from boomerang.clients.router import RouterClient
        from boomerang.v1 import router_service_pb2 as rtpb

        from boomerang_tools.bench.workload import MODEL

        want = self.cfg.decode_engines + self.cfg.prefill_engines
        deadline = time.monotonic() + timeout
        async with RouterClient(self.router_address, timeout=2.0) as router:
            while time.monotonic() < deadline:
                try:
                    listed = await router.list_engines(rtpb.RouterServiceListEnginesRequest(model=MODEL))
                    if sum(1 for e in listed.engines if e.available) >= want:
                        return
                except Exception:  # noqa: BLE001 - not yet
                    pass
                await asyncio.sleep(0.2)
        raise RuntimeError("the router did not see the benchmark's engines in time")

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

    async def measure(self) -> dict[str, Any]:
        """Every measurement asked for, in an order that keeps each one's conditions clean."""
        cfg = self.cfg
        want = cfg.phases.__contains__
        results: dict[str, Any] = {"scale": [], "timings_s": {}}
        mark = time.perf_counter()

        def lap(name: str) -> None:
            nonlocal mark
            now = time.perf_counter()
            results["timings_s"][name] = round(results["timings_s"].get(name, 0.0) + now - mark, 1)
            mark = now

        small_tiers = [t for t in cfg.scale_tiers if t < cfg.leases] if want("scale") else []
        big_tiers = [t for t in cfg.scale_tiers if t > cfg.leases] if want("scale") else []
        for tier in small_tiers:
            results["scale"].append(await phases.scale_point(self, tier, None))
            lap("scale")
        results["preload"] = await phases.preload_to(self, cfg.leases)
        lap("preload")
        if want("plans"):
            results["plan"] = await phases.plan_rates(self)
            lap("plans")
        if want("scale"):
            at_rate = next((r for r in results.get("plan", {}).get("rates", []) if r["rate"] == cfg.scale_rate), None)
            results["scale"].append(await phases.scale_point(self, cfg.leases, at_rate))
            lap("scale")
        if want("register"):
            results["register"] = await phases.registrations(self)
            lap("register")
        if want("expiry"):
            results["expiry"] = await phases.expiry(self)
            lap("expiry")
        if want("gateway"):
            results["gateway_overhead"] = await overhead.gateway_overhead(self)
            self.services.stop("gateway", "naive-proxy", "sim-prefill", "sim-decode")
            lap("gateway")
        for tier in big_tiers:
            results["scale"].append(await phases.scale_point(self, tier, None))
            lap("scale")
        self.sample_memory()
        return results


async def run_bench(
    cfg: BenchConfig, database_url: str, data_dir: Path, out_dir: Path, keep_database: bool, profile: bool = False
) -> dict[str, Any]:
    """Run the benchmark and write `bench-report.json` and `bench-report.md` into `out_dir`."""
    console = Console(stderr=True)
    started = time.time()
    bench = Bench(cfg, database_url, data_dir, console, keep_database)
    if profile:
        bench.profile_dir = out_dir / "bench-profiles"
    host = machine()
    try:
        with bench.progress:
            task = bench.progress.add_task("starting Postgres and the services", total=None)
            await bench.start()
            bench.progress.remove_task(task)
            results = await bench.measure()
    finally:
        await bench.stop()
    report = build_report(cfg, results, bench.memory, host, bench.db.notes, started, time.time())
    if bench.profiles:
        report["profiles"] = bench.profiles
    json_path, md_path = write_report(report, out_dir)
    console.print(md_path.read_text())
    console.print(f"wrote {json_path} and {md_path}")
    return report
