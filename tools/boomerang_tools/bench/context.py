"""A benchmark run's settings and state: the database, the services as child processes, the
engines, the client processes, and `--profile`'s py-spy samplers.

`cli.py` starts and measures one; `phases.py`, `schedule.py` and `gateway.py` measure over it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from boomerang.clients.registry import RegistryClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb
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

from boomerang_tools.bench.database import BenchDatabase, EngineRow
from boomerang_tools.bench.loadgen import Workers
from boomerang_tools.bench.workload import BLOCK_SIZE, MODEL
from boomerang_tools.sim import hfmodel
from boomerang_tools.stack.children import Child, ChildFailed, stop_all
from boomerang_tools.stack.stack import wait_engines

log = logging.getLogger(__name__)
TTL_MARGIN_SECONDS = 10.0  # the registry's default BOOMERANG_TTL_MARGIN_SECONDS
ENGINE_TTL_SECONDS = 3600  # long enough that nothing preloaded expires during a run
PHASES = ("scale", "plans", "lookup", "hook", "register", "expiry", "gateway")


@dataclass
class BenchConfig:
    """Sizes, rates and durations of one run."""

    quick: bool = False
    leases: int = 100_000  # live leases for the plan rates
    scale_tiers: list[int] = field(default_factory=lambda: [10_000, 100_000, 1_000_000])
    tenants: int = 1000
    decode_engines: int = 8
    prefill_engines: int = 2
    clients: int = 3  # load-generator processes
    step_seconds: float = 10.0  # each measured plan rate
    rates: list[int] = field(default_factory=lambda: [500, 1000, 2000])
    search_rates: list[int] = field(default_factory=lambda: [3000, 4000, 5000, 6000, 8000])
    scale_rate: int = 1000
    path_seconds: float = 5.0  # each step of the lookup comparison, per lookup
    p99_budget_ms: float = 5.0
    register_seconds: float = 10.0
    register_concurrency: int = 64  # per client process
    expiry_leases: int = 100_000
    expiry_window_seconds: float = 60.0
    gateway_seconds: float = 30.0
    gateway_slots: int = 2  # concurrent conversations per path
    seed: int = 1
    phases: set[str] = field(default_factory=lambda: set(PHASES))
    control_plane: bool = False  # the registry and the router as one `boomerang control-plane` process

    @classmethod
    def for_run(cls, quick: bool, leases: int | None = None, step_seconds: float | None = None) -> BenchConfig:
        """The full run, or `--quick` (under two minutes), with optional overrides."""
        cfg = cls(quick=quick)
        if quick:
            cfg.step_seconds = 3.0
            cfg.search_rates = [3000, 4000]
            cfg.path_seconds = 2.0
            cfg.register_seconds = 4.0
            cfg.expiry_leases = 10_000
            cfg.expiry_window_seconds = 10.0
            cfg.gateway_seconds = 6.0
        if leases is not None:
            cfg.leases = leases
        if step_seconds is not None:
            cfg.step_seconds = step_seconds
            cfg.path_seconds = min(cfg.path_seconds, step_seconds)
        small = max(1, min(10_000, cfg.leases // 10))
        cfg.scale_tiers = sorted({small, cfg.leases} | (set() if quick else {max(1_000_000, cfg.leases)}))
        return cfg


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


def memory_mb(pid: int) -> dict[str, float]:
    """Resident and peak resident memory of a process, MB (Linux /proc)."""
    out = {"rss_mb": 0.0, "peak_rss_mb": 0.0}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                out["rss_mb"] = round(int(line.split()[1]) / 1024, 1)
            elif line.startswith("VmHWM:"):
                out["peak_rss_mb"] = round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return out


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds a process has used (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU used by groups of processes between `start()` and `stop()`, seconds per group.

    Each process counts from its value at `start()` (or from zero when it started later);
    `refresh` re-lists a group's processes at `stop()` (Postgres backends come and go). A
    process that ended in between is not counted, so a figure may fall short, never over.
    """

    def __init__(self, pids: dict[str, list[int]], refresh: dict[str, Callable[[], list[int]]]):
        self.pids = pids
        self.refresh = refresh
        self.before: dict[int, float] = {}

    def start(self) -> CpuMeter:
        """Take the starting point."""
        self.before = {p: cpu_seconds(p) for pids in self.pids.values() for p in pids}
        return self

    def stop(self) -> dict[str, float]:
        """CPU seconds used since `start()`, per group."""
        out = {}
        for name, pids in self.pids.items():
            now = self.refresh[name]() if name in self.refresh else pids
            out[name] = round(sum(max(0.0, cpu_seconds(p) - self.before.get(p, 0.0)) for p in set(now)), 3)
        return out


@dataclass
class Services:
    """Children started by the benchmark, stopped in reverse order."""

    log_dir: Path
    env: dict[str, str]
    children: dict[str, Child] = field(default_factory=dict)
    restarted: list[str] = field(default_factory=list)  # children started twice (see `_ready`)

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Child:
        """Start `boomerang <args>` (does not wait)."""
        child = Child(name, args, self.log_dir, {**self.env, **(env or {})})
        child.start()
        self.children[name] = child
        return child

    async def ready(self, *names: str, timeout: float = 60.0) -> list[str]:
        """Wait until the named children listen; their addresses."""
        return list(await asyncio.gather(*(self._ready(n, timeout) for n in names)))

    async def _ready(self, name: str, timeout: float) -> str:
        """One child's address; a child that exited before it was ready is started once more.

        Rarely (once in the runs we kept) a simulated engine died between fork and exec with
        only a gRPC poller error in its log, never having run: started from a process full
        of gRPC threads, the forked child runs Python (the parent-death signal's preexec_fn)
        before it execs. A second start of the same command is the same measurement; a
        child that fails twice, or does not start in time, fails the run.
        """
        child = self.children[name]
        try:
            return await asyncio.to_thread(child.wait_ready, timeout)
        except ChildFailed as exc:
            if child.alive():
                raise
            child.finish(5)
            log.warning("%s exited before it was ready (exit code %s); starting it once more:\n%s",
                        name, child.proc.returncode if child.proc else None, exc)
            self.restarted.append(name)
            again = self.start(name, child.args, child.env)
            return await asyncio.to_thread(again.wait_ready, timeout)

    def memory(self) -> dict[str, dict[str, float]]:
        """Memory of every running child."""
        return {n: memory_mb(c.proc.pid) for n, c in self.children.items() if c.alive() and c.proc is not None}

    def pids(self, *names: str) -> dict[str, list[int]]:
        """Process ids of the named running children (a process known by two names, under the first)."""
        out: dict[str, list[int]] = {}
        for n, c in self.children.items():
            if n in names and c.proc is not None and c.alive() and all(c.proc.pid not in p for p in out.values()):
                out[n] = [c.proc.pid]
        return out

    def stop(self, *names: str) -> None:
        """Stop the named children (all when none are named), last started first."""
        chosen = [c for n, c in self.children.items() if not names or n in names]
        stop_all(chosen, timeout=10)
        for n in [n for n, c in self.children.items() if c in chosen]:
            del self.children[n]


@dataclass
class BenchEngines:
    """Decode and prefill engines registered for the plan workload, kept alive by heartbeats."""

    registry: RegistryClient
    decode: list[EngineRow] = field(default_factory=list)
    prefill: list[str] = field(default_factory=list)
    _beats: asyncio.Task[None] | None = None

    async def register(self, decode: int, prefill: int) -> None:
        """RegisterEngine for `decode` decode and `prefill` prefill engines."""
        generation = int(time.time() * 1000)
        for kind, role, count, first_port in (("d", tpb.ENGINE_ROLE_DECODE, decode, 5600),
                                              ("p", tpb.ENGINE_ROLE_PREFILL, prefill, 5700)):
            for i in range(count):
                engine_id, port = f"bench-{kind}{i}", first_port + i
                await self.registry.register_engine(
                    rpb.RegisterEngineRequest(
                        engine=tpb.Engine(
                            engine_id=engine_id, role=role, model=MODEL, side_channel_host="127.0.0.1",
                            side_channel_port=port, http_base_url=f"http://127.0.0.1:{port}",
                            registration_generation=generation, kv_blocks_ttl_seconds=ENGINE_TTL_SECONDS,
                            block_size=BLOCK_SIZE, tp_size=1, dcp_size=1, pp_size=1, bytes_per_block=1 << 20,
                            kv_recompute_threshold=64,
                        ),
                        request_id=f"bench-register-{engine_id}",
                    )
                )
                if kind == "d":
                    self.decode.append(EngineRow(engine_id, MODEL, generation, "127.0.0.1", port, ENGINE_TTL_SECONDS))
                else:
                    self.prefill.append(engine_id)
        self._beats = asyncio.create_task(self._heartbeats(generation))

    async def _heartbeats(self, generation: int) -> None:
        ids = [e.engine_id for e in self.decode] + self.prefill
        while True:
            await asyncio.sleep(2.0)
            for engine_id in ids:
                with contextlib.suppress(Exception):
                    await self.registry.heartbeat(rpb.HeartbeatRequest(
                        engine_id=engine_id, registration_generation=generation), timeout=2.0)

    async def stop(self) -> None:
        """Stop heartbeating."""
        if self._beats is not None:
            self._beats.cancel()
            await asyncio.gather(self._beats, return_exceptions=True)


def py_spy() -> str | None:
    """The py-spy binary next to this Python, or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


class Sampler:
    """`--profile`: py-spy record on some processes for a while (collapsed stacks kept beside
    the report, the busiest functions in it)."""

    def __init__(self, out_dir: Path, label: str, pids: dict[str, int], seconds: float):
        self.procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        binary = py_spy()
        if binary is None:
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, pid in pids.items():
            raw = out_dir / f"{label}-{name}.txt"
            cmd = [binary, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))), "--rate", "250",
                   "--format", "raw", "--nonblocking", "--output", str(raw)]
            self.procs[name] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), raw)

    def finish(self, timeout: float = 30.0) -> dict[str, dict[str, object]]:
        """Wait for the samplers; per service, the busiest functions (self and inclusive %)."""
        out: dict[str, dict[str, object]] = {}
        for name, (proc, raw) in self.procs.items():
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                continue
            if raw.exists():
                out[name] = summarize_collapsed(raw.read_text())
                out[name]["file"] = str(raw)
        return out


def _frame(frame: str) -> str:
    # py-spy raw frames look like "function (path/to/file.py:123)"; keep function and file.
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    parts = where.split("/")
    short = "/".join(parts[-2:]) if len(parts) > 1 else where
    return f"{name} ({short})"


def summarize_collapsed(text: str, top: int = 15) -> dict[str, object]:
    """Top functions by self and inclusive share of samples, from py-spy's collapsed stacks."""
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame(f) for f in stack.split(";") if f]
        if frames:
            self_time[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n

    def share(c: Counter[str]) -> list[dict[str, Any]]:
        return [{"function": f, "percent": round(100 * n / total, 1)} for f, n in c.most_common(top)]

    return {"samples": total, "self": share(self_time) if total else [], "inclusive": share(inclusive) if total else []}


SIM_MODEL = "Qwen/Qwen3-32B"
# The gateway this phase measures: anonymous tenants, and in-process tokenizing with the
# simulator's own model files, as it would with a real model's (P's /tokenize its fallback).
GATEWAY_ENV = {"BOOMERANG_ALLOW_ANONYMOUS": "true", "BOOMERANG_TOKENIZERS": f"{SIM_MODEL}={hfmodel.folder(thinking=False)}"}


class CountColumn(ProgressColumn):
    """`done/total` for tasks with a total, nothing for open-ended ones."""

    def render(self, task: Task) -> Text:
        if task.total is None:
            return Text("")
        return Text(f"{task.completed:,.0f}/{task.total:,.0f}")


class Bench:
    """Everything a run holds: the database, the services, the engines, the client processes."""

    def __init__(self, cfg: BenchConfig, database_url: str, data_dir: Path, console: Console):
        self.cfg = cfg
        self.db = BenchDatabase(database_url, data_dir)
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
        self.memory.update(self.services.memory())

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

    async def run_jobs(
        self, jobs: list[dict[str, Any]], label: str, start_at: float, seconds: float,
        names: tuple[str, ...], profile: str = "",
    ) -> tuple[list[dict[str, Any]], dict[str, float]]:
        """The client processes' `jobs` (starting at `start_at`, lasting `seconds`) under a
        progress line: their results, and the CPU seconds of the named services, Postgres and
        the clients from the start on; with `profile` (and `--profile`) py-spy samples them."""
        task = self.progress.add_task(label, total=None)
        running = asyncio.ensure_future(self.workers.run(jobs, timeout=seconds + 120))
        await asyncio.sleep(max(0.0, start_at - time.time()))
        meter = (await self.cpu_meter(*names)).start()
        sampler = self.sampler(profile, names, seconds) if profile else None
        results = await running
        cpu = meter.stop()
        await self.collect(profile, sampler)
        self.progress.remove_task(task)
        return results, cpu

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
        engines = self.cfg.decode_engines + self.cfg.prefill_engines
        await wait_engines(self.router_address, engines, model=MODEL)

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
