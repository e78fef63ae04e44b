"""`boomerang demo` (`make demo`): AWS's multi-turn experiment, replayed end to end.

Brings the whole system up (embedded Postgres unless a database is configured, registry,
router, reaper, gateway, and a simulated prefill and decode engine per profile), replays
agent conversations growing to AWS's context lengths with Boomerang off and on, prints
AWS's table beside AWS's figures, writes `demo-report.json` and `demo-report.png`, shows one
conversation's audit trail from Postgres, and exits non-zero on any failed request, any
corrupt pull, or any reply that differs between off and on.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

import httpx
from rich.console import Console

from boomerang_tools.demo.show import conclude, measure
from boomerang_tools.demo.workload import POINTS, QUICK_POINTS
from boomerang_tools.sim.costmodel import PROFILES
from boomerang_tools.stack.children import ChildFailed
from boomerang_tools.stack.postgres import PostgresError
from boomerang_tools.stack.stack import SimSpec, Stack, StackConfig

CLAIM_DEADLINE_MS = 1000


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `demo` subcommand."""
    parser = subparsers.add_parser(
        "demo",
        help="replay AWS's multi-turn experiment on simulated engines, Boomerang off vs on",
        description="Bring everything up, replay agent conversations to 24k tokens with Boomerang off and on, "
        "and report time to first token beside AWS's published figures.",
    )
    parser.add_argument("--quick", action="store_true", help="three context lengths per profile (for tests)")
    parser.add_argument("--reps", type=int, default=1, help="conversations per profile and mode (default 1)")
    parser.add_argument("--profiles", default="qwen3-32b,glm-5-fp8", help="comma-separated (default both)")
    parser.add_argument("--out", default=".", help="folder for demo-report.json and demo-report.png (default .)")
    parser.add_argument("--database-url", help="PostgreSQL URL (BOOMERANG_DATABASE_URL); default: embedded cluster")
    parser.add_argument("--data-dir", default=".boomerang", help="embedded database and logs (default .boomerang)")
    parser.set_defaults(handler=_run)


def _sim_stats(urls: list[str]) -> dict[str, int]:
    keys = ("pulls", "pulled_tokens", "corrupt_pulls", "expired_or_freed_reads", "corrupt_loads",
            "expired_or_freed_loads", "computed_tokens")
    total = dict.fromkeys(keys, 0)
    with httpx.Client(timeout=5.0) as http:
        for url in urls:
            stats = http.get(url + "/sim/stats").json()
            for key in keys:
                total[key] += int(stats.get(key, 0))
    return total


def _run(args: argparse.Namespace) -> int:
    console = Console()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    unknown = [p for p in profiles if p not in POINTS]
    if unknown or not profiles:
        raise SystemExit(f"boomerang demo: --profiles: unknown {unknown}; known: {', '.join(POINTS)}")
    reps = args.reps
    if not 1 <= reps <= 8:
        raise SystemExit("boomerang demo: --reps must be 1 to 8")
    points = {p: (QUICK_POINTS if args.quick else POINTS)[p] for p in profiles}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    console.rule("[bold]Boomerang demo[/bold]: KV-cache reuse in prefill/decode disaggregated serving")
    console.print(
        "Replaying multi-turn agent conversations (system prompt, tool results, the model's own replies) "
        f"to {', '.join(f'{max(points[p]):,} tokens ({p})' for p in profiles)}, once with Boomerang off "
        "(the prefill engine recomputes the whole prompt, prefix caching off as in AWS's tests) and once on "
        "(it pulls the previous turn's KV back from the decode engine)."
    )
    sims = [SimSpec(role, p, 0) for p in profiles for role in ("prefill", "decode")]
    config = StackConfig(
        data_dir=Path(args.data_dir),
        database_url=args.database_url or os.environ.get("BOOMERANG_DATABASE_URL", ""),
        gateway_port=0,
        grpc_ports=(0, 0, 0),
        sims=sims,
        log_level="WARNING",
        # Every process shares one small machine here, so a claim can wait on the CPU; a
        # longer claim deadline keeps a busy laptop from turning pulls into recomputes.
        router_args=["--claim-deadline-ms", str(CLAIM_DEADLINE_MS)],
        gateway_args=["--plan-timeout-seconds", str(CLAIM_DEADLINE_MS / 1000 + 0.25)],
    )
    stack = Stack(config)
    try:
        with console.status("Starting Postgres, registry, router, reaper, gateway and simulated engines…"):
            stack.start()
    except (ChildFailed, PostgresError) as exc:
        console.print(f"[red]boomerang demo: could not start the system:[/red] {exc}")
        return 1
    try:
        console.print(f"System up in {time.monotonic() - started:.1f}s: gateway {stack.gateway_url}, "
                      f"{len(sims)} simulated engines, logs in {stack.log_dir}/")

        result = measure(console, stack.gateway_url, profiles, points, reps,
                         {p: PROFILES[p].served_model_name for p in profiles})
        stats = _sim_stats(stack.prefill_urls + stack.decode_urls)
        return conclude(console, result, stats, profiles, points, out_dir, stack.database_url, started)
    finally:
        with console.status("Stopping…"):
            stack.stop()
