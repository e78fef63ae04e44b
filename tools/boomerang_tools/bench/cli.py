"""`boomerang bench [--quick]`: measure plan latency, registrations, expiry lag, gateway overhead."""

from __future__ import annotations

import argparse
from pathlib import Path

from boomerang_server.config import CommonSettings, load_settings, run_async

from boomerang_tools.bench.config import PHASES, BenchConfig
from boomerang_tools.bench.naive_proxy import serve
from boomerang_tools.bench.runner import run_bench


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
    parser.add_argument("--keep-database", action="store_true", help="keep the scratch database afterwards")
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
    run_async(run_bench(cfg, settings.database_url, args.data_dir, args.out, args.keep_database, args.profile))
    return 0
