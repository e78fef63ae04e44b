"""`boomerang bench [--quick]`: measure plan latency, registrations, expiry lag, gateway overhead.

One run: start everything (context.py), measure in order, write the report, stop everything.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path
from typing import Any

from boomerang_server.config import CommonSettings, load_settings, run_async
from rich.console import Console

from boomerang_tools.bench import gateway, phases, schedule
from boomerang_tools.bench.context import PHASES, Bench, BenchConfig
from boomerang_tools.bench.naive_proxy import serve
from boomerang_tools.bench.report import build_report, write_report


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `bench` subcommand."""
    parser = subparsers.add_parser(
        "bench",
        help="benchmark Boomerang's own cost (plans, registrations, expiry, gateway overhead)",
        description="Start the services on Postgres (embedded unless BOOMERANG_DATABASE_URL is set; a fresh "
        "scratch database either way), preload live leases, drive open-loop load from several client "
        "processes, compare the gateway with a naive pass-through proxy, and write bench-report.json "
        "and bench-report.md.",
    )
    parser.add_argument("--quick", action="store_true", help="a shorter run (under two minutes)")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for bench-report.json/.md (default .)")
    parser.add_argument("--database-url", help="PostgreSQL server to make the scratch database on "
                        "(BOOMERANG_DATABASE_URL; default: the embedded cluster)")
    parser.add_argument("--data-dir", type=Path, default=Path(".boomerang"),
                        help="embedded cluster and service logs (default .boomerang)")
    parser.add_argument("--clients", type=int, default=3, help="load-generator processes (default 3)")
    parser.add_argument("--leases", type=int, help="live leases for the plan rates (default 100000)")
    parser.add_argument("--step-seconds", type=float, help="seconds per measured plan rate (default 10; quick 3)")
    parser.add_argument("--expiry-leases", type=int, help="leases in the expiry test (default 100000; quick 10000)")
    parser.add_argument("--expiry-window", type=float, help="seconds their deadlines spread over (default 60; quick 10)")
    parser.add_argument("--gateway-seconds", type=float, help="seconds of gateway-overhead turns (default 30; quick 6)")
    parser.add_argument("--register-seconds", type=float, help="seconds of registrations (default 10; quick 4)")
    parser.add_argument("--profile", action="store_true",
                        help="sample the services with py-spy during the 1,000/s step, the registrations and the "
                        "gateway turns (collapsed stacks in OUT/bench-profiles, top functions in the report)")
    parser.add_argument("--control-plane", action="store_true",
                        help="run the registry and the router as one process (`boomerang control-plane`; "
                        "their figures are that process's, reported under registry)")
    parser.add_argument("--only", help="comma-separated subset of: " + ", ".join(PHASES) + " (default: all)")
    # The naive proxy runs as its own process through this same command (not for users).
    parser.add_argument("--serve-naive-proxy", metavar="HOST:PORT", help=argparse.SUPPRESS)
    parser.add_argument("--prefill", action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--decode", action="append", default=[], help=argparse.SUPPRESS)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    if args.serve_naive_proxy:
        run_async(serve(args.serve_naive_proxy, args.prefill, args.decode))
        return 0

    settings = load_settings(CommonSettings, database_url=args.database_url)
    cfg = BenchConfig.for_run(args.quick, args.leases, args.step_seconds)
    if args.clients < 1:
        raise SystemExit("boomerang bench: --clients must be at least 1")
    cfg.clients = args.clients
    cfg.control_plane = args.control_plane
    for name, attr in (("expiry_leases", "expiry_leases"), ("expiry_window", "expiry_window_seconds"),
                       ("gateway_seconds", "gateway_seconds"), ("register_seconds", "register_seconds")):
        value = getattr(args, name)
        if value is not None:
            if value <= 0:
                raise SystemExit(f"boomerang bench: --{name.replace('_', '-')} must be positive")
            setattr(cfg, attr, value)
    if args.only:
        chosen = {p.strip() for p in args.only.split(",") if p.strip()}
        if not chosen or chosen - set(PHASES):
            raise SystemExit(f"boomerang bench: --only takes a comma-separated subset of {', '.join(PHASES)}")
        cfg.phases = chosen
    if cfg.leases < 10:
        raise SystemExit("boomerang bench: --leases must be at least 10")
    run_async(run_bench(cfg, settings.database_url, args.data_dir, args.out, args.profile))
    return 0


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
        results["gateway_overhead"] = await gateway.gateway_overhead(b)
        results["control_plane"] = await gateway.control_plane(b)
        results["control_plane_hook"] = await gateway.control_plane_hook(b)
        results["pulled_turn_stages"] = await gateway.pulled_turn_stages(b)
        results["first_turns"] = await gateway.first_turns(b)
        b.services.stop("gateway", "naive-proxy", "sim-prefill", "sim-decode", "gateway-hook", "naive-proxy-hook",
                        *gateway.HOOKED_ENGINES)
        lap("gateway")
    for tier in big_tiers:
        results["scale"].append(await phases.scale_point(b, tier, None))
        lap("scale")
    b.sample_memory()
    return results


async def run_bench(
    cfg: BenchConfig, database_url: str, data_dir: Path, out_dir: Path, profile: bool
) -> dict[str, Any]:
    """Run the benchmark and write `bench-report.json` and `bench-report.md` into `out_dir`."""
    console = Console(stderr=True)
    started = time.time()
    bench = Bench(cfg, database_url, data_dir, console)
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
