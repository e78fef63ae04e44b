"""One benchmark run: start everything, measure in order, write the report, stop everything."""

from __future__ import annotations

import logging
import os
import platform
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from boomerang_tools.bench import overhead, phases, schedule, stages
from boomerang_tools.bench.config import BenchConfig
from boomerang_tools.bench.context import Bench
from boomerang_tools.bench.report import build_report, write_report

log = logging.getLogger(__name__)


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


async def measure(b: Bench) -> dict[str, Any]:
    """Every measurement asked for, in an order that keeps each one's conditions clean."""
    cfg = b.cfg
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
        results["scale"].append(await phases.scale_point(b, tier, None))
        lap("scale")
    results["preload"] = await phases.preload_to(b, cfg.leases)
    lap("preload")
    if want("plans"):
        results["plan"] = await phases.plan_rates(b)
        lap("plans")
    if want("lookup"):
        results["lookup_paths"] = await phases.lookup_paths(b)
        lap("lookup")
    if want("scale"):
        at_rate = next((r for r in results.get("plan", {}).get("rates", []) if r["rate"] == cfg.scale_rate), None)
        results["scale"].append(await phases.scale_point(b, cfg.leases, at_rate))
        lap("scale")
    if want("hook"):
        results["hook_schedule"] = await schedule.hook_schedule(b)
        lap("hook")
    if want("register"):
        results["register"] = await phases.registrations(b)
        lap("register")
    if want("expiry"):
        results["expiry"] = await phases.expiry(b)
        lap("expiry")
    if want("gateway"):
        results["gateway_overhead"] = await overhead.gateway_overhead(b)
        results["control_plane"] = await overhead.control_plane(b)
        results["control_plane_hook"] = await overhead.control_plane_hook(b)
        results["pulled_turn_stages"] = await stages.pulled_turn_stages(b)
        results["first_turns"] = await stages.first_turns(b)
        b.services.stop("gateway", "naive-proxy", "sim-prefill", "sim-decode", "gateway-hook", "naive-proxy-hook",
                        *overhead.HOOKED_ENGINES)
        lap("gateway")
    for tier in big_tiers:
        results["scale"].append(await phases.scale_point(b, tier, None))
        lap("scale")
    b.sample_memory()
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
            results = await measure(bench)
    finally:
        await bench.stop()
    report = build_report(cfg, results, bench.memory, host, bench.db.notes, started, time.time())
    if bench.profiles:
        report["profiles"] = bench.profiles
    # Children that exited before they were ready and were started once more (Services._ready).
    report["children_restarted"] = bench.services.restarted
    json_path, md_path = write_report(report, out_dir)
    console.print(md_path.read_text())
    console.print(f"wrote {json_path} and {md_path}")
    return report
