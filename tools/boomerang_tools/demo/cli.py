"""`boomerang demo` (`make demo`): AWS's multi-turn experiment, replayed end to end.

Brings the whole system up (embedded Postgres unless a database is configured, registry,
router, reaper, gateway, and a simulated prefill and decode engine per profile), replays
agent conversations growing to AWS's context lengths with Boomerang off (in a deployment of
its own, with no Boomerang in it) and on, prints AWS's table beside AWS's figures, writes
`demo-report.json` and `demo-report.png`, shows one conversation's audit trail (read over
gRPC from the router and the registry), and exits non-zero on any failed request, any
corrupt pull, any reply that differs between off and on, or an "off" turn that did not
recompute its whole prompt. It also measures the skeptic's alternative (`prefix-cache`: no
Boomerang, prefix caching on the prefill engine, sticky routing) with 1, 8 and 32
conversations sharing that engine, beside off and Boomerang.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import httpx
from boomerang_server.config import normalize_database_url
from boomerang_server.db import upgrade
from rich.console import Console
from rich.table import Table

from boomerang_tools.demo.grid import run_grid
from boomerang_tools.demo.modes import (
    MODES,
    OFF,
    PREFIX_CACHE_BLOCKS,
    Mode,
    parse_modes,
    stack_config,
)
from boomerang_tools.demo.runner import RunResult
from boomerang_tools.demo.show import conclude, measure
from boomerang_tools.demo.workload import POINTS, QUICK_POINTS
from boomerang_tools.sim.costmodel import PROFILES
from boomerang_tools.sim.hbm import (
    MAX_BLOCK_SECONDS_SHARE,
    MIN_PULLS_KEPT,
    HbmResult,
    HbmWorkload,
    compare,
    figures,
)
from boomerang_tools.stack.children import ChildFailed
from boomerang_tools.stack.postgres import PostgresError
from boomerang_tools.stack.stack import SimSpec, Stack

DEFAULT_PROFILES = ("qwen3-32b", "glm-5-fp8", "qwen3-32b-h200", "qwen3-8b-h200")
WIDE = 8  # conversations sharing P beyond which a level runs on the first profile only


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `demo` subcommand."""
    parser = subparsers.add_parser(
        "demo",
        help="replay AWS's multi-turn experiment on simulated engines, Boomerang off vs on",
        description="Bring everything up, replay agent conversations to 24k tokens with Boomerang off and on, "
        "and report time to first token beside AWS's published figures.",
    )
    parser.add_argument("--quick", action="store_true", help="three context lengths per profile (for tests)")
    parser.add_argument("--hbm", choices=("on", "off"), default="on",
                        help="first compare decode memory under vLLM's fixed TTL and Boomerang's releases (default on)")
    parser.add_argument("--reps", type=int, default=1, help="conversations per profile and mode (default 1)")
    parser.add_argument("--profiles", default=",".join(DEFAULT_PROFILES),
                        help=f"comma-separated (default {','.join(DEFAULT_PROFILES)}: AWS's two, then the H200's two)")
    parser.add_argument("--out", default=".", help="folder for demo-report.json and demo-report.png (default .)")
    parser.add_argument("--database-url", help="PostgreSQL URL (BOOMERANG_DATABASE_URL); default: embedded cluster")
    parser.add_argument("--data-dir", default=".boomerang", help="embedded database and logs (default .boomerang)")
    parser.add_argument("--modes", default=",".join(m.name for m in MODES),
                        help=f"deployments to measure, comma-separated (default {','.join(m.name for m in MODES)})")
    parser.add_argument("--grid", action="store_true",
                        help="instead: the router's plan against each option measured (H200 profiles, contexts, links)")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="--grid: the simulator's time scale (default 1.0)")
    parser.set_defaults(handler=_run)


STAT_KEYS = ("pulls", "pulled_tokens", "corrupt_pulls", "expired_or_freed_reads", "corrupt_loads",
             "expired_or_freed_loads", "computed_tokens", "tokenize_requests", "prefix_cache_hits",
             "prefix_cache_evicted_blocks")


def _rotations(args: argparse.Namespace, profiles: list[str], mode: Mode) -> list[tuple[str, int, tuple[int, ...]]]:
    """(profile, conversations, contexts) for each level above one a mode is measured at.

    A level costs its conversations times their turns, so each measures only where P's cache
    turns from holding them to evicting them: up to `WIDE` conversations at AWS's two
    published contexts, every profile; more on the first profile only, at 2k and 8k (past
    8k they are evicted all the more). --quick: the longest context."""
    levels = [n for n in (mode.quick_levels if args.quick else mode.levels) if n > 1]
    if args.quick:
        return [(p, n, QUICK_POINTS[p][-1:]) for p in profiles for n in levels]
    return [(p, n, (QUICK_POINTS[p][0], QUICK_POINTS[p][-1]) if n <= WIDE else QUICK_POINTS[p][:2])
            for p in profiles for n in levels if n <= WIDE or p == profiles[0]]


def _sim_stats(urls: list[str]) -> tuple[dict[str, int], list[float], dict[str, float]]:
    """The engines' summed counters, the prefill hooks' median plan times (ms) if they plan,
    and the time their scheduler loops spent in Boomerang's hook (ms: total, longest call;
    0 when the engines run no hook: they never call Boomerang)."""
    total = dict.fromkeys(STAT_KEYS, 0)
    plan_ms = []
    loop = {"engine_loop_in_boomerang_ms": 0.0, "engine_loop_longest_call_ms": 0.0}
    with httpx.Client(timeout=5.0) as http:
        for url in urls:
            stats = http.get(url + "/sim/stats").json()
            for key in STAT_KEYS:
                total[key] += int(stats.get(key, 0))
            hook = stats.get("hook", {})
            if "plan_ms_p50" in hook:
                plan_ms.append(float(hook["plan_ms_p50"]))
            loop["engine_loop_in_boomerang_ms"] += float(hook.get("scheduler_ms_total", 0.0))
            loop["engine_loop_longest_call_ms"] = max(loop["engine_loop_longest_call_ms"],
                                                      float(hook.get("scheduler_ms_max", 0.0)))
    return total, plan_ms, loop


def _run_mode(console: Console, args: argparse.Namespace, run: dict[str, Any], mode: Mode, last: bool) -> int | None:
    """One deployment: bring it up, measure it, record its engines' counters; on the last
    one (its services still up, for the audit trail) conclude. None: go on."""
    profiles, points, result = run["profiles"], run["points"], run["result"]
    if not mode.boomerang and not mode.baseline:
        # The alternative to Boomerang on AWS's profiles (the skeptic's question is about AWS's
        # setting).
        profiles = [p for p in profiles if PROFILES[p].published is not None] or profiles[:1]
    if args.quick and mode.quick_profiles is not None:
        profiles = profiles[:mode.quick_profiles]
    rotations = _rotations(args, profiles, mode)
    # Per profile a prefill then a decode engine (the order prefill_urls/decode_urls keep).
    sims = [SimSpec(role, p, 0) for p in profiles for role in ("prefill", "decode")]
    stack = Stack(stack_config(mode, sims, Path(args.data_dir), _database_url(args)))
    if mode.boomerang:
        what = "Postgres, registry, router, reaper, gateway and simulated engines"
    else:
        what = "simulated engines and a gateway with no control plane"
    try:
        with console.status(f"Starting {what} ({mode.name})…"):
            stack.start()
    except (ChildFailed, PostgresError) as exc:
        console.print(f"[red]boomerang demo: could not start the system ({mode.name}):[/red] {exc}")
        return 1
    try:
        console.print(f"[bold]{mode.label}[/bold]: {mode.summary}. Up: gateway {stack.gateway_url}, "
                      f"logs in {stack.log_dir}/")
        audited = dict(result.conversation_ids)
        measure(console, stack.gateway_url, profiles, points, args.reps,
                {p: PROFILES[p].served_model_name for p in profiles}, result, mode, rotations)
        if not mode.boomerang:
            result.conversation_ids = audited  # the audit trail shows a Boomerang conversation
        run["rotations"] += [(mode.name, *r) for r in rotations]
        for i, p in enumerate(profiles):
            counts, plan_ms, loop = _sim_stats([stack.prefill_urls[i], stack.decode_urls[i]])
            for key, value in counts.items():
                run["stats"][key] = run["stats"].get(key, 0) + value
            run["extra"][(p, mode.name)] = {"tokenize_calls": counts["tokenize_requests"], "pulls": counts["pulls"],
                                            **{k: round(v, 2) for k, v in loop.items()},
                                            **({"engine_plan_ms_p50": round(plan_ms[0], 2)} if plan_ms else {})}
            if not mode.boomerang and not mode.baseline:
                run["extra"][(p, mode.name)].update(prefix_cache_capacity_tokens=PREFIX_CACHE_BLOCKS * 16,
                                                    prefix_cache_hit_tokens=counts["prefix_cache_hits"],
                                                    prefix_cache_evicted_blocks=counts["prefix_cache_evicted_blocks"])
        if not last:
            return None
        return conclude(console, result, run["stats"], run["profiles"], points, Path(args.out),
                        (stack.registry_address, stack.router_address),
                        run["started"], run["modes"], run["extra"], run["rotations"])
    finally:
        with console.status("Stopping…"):
            stack.stop()


def run_hbm(console: Console, out: Path, quick: bool = False) -> dict[str, Any]:
    """The HBM comparison: decode memory under vLLM's fixed TTL and under Boomerang's releases,
    on the same conversations (sim/hbm.py, in simulated time: the pauses are minutes long, the
    replay takes seconds). Run both policies, print them side by side, write `demo-hbm.json`;
    the figures."""
    workload = replace(HbmWorkload(), conversations=200) if quick else HbmWorkload()
    with console.status("HBM: replaying conversations against one decode engine's KV pool…"):
        fixed, boomerang = compare(workload)
    got = figures(fixed, boomerang)
    tenants = ", ".join(f"{t.name} (pause median {t.pause_median_s:g} s)" for t in workload.tenants)
    console.rule("[bold]Decode memory[/bold]: fixed TTL vs Boomerang's release")
    console.print(
        f"{workload.conversations} conversations ({tenants}; {workload.end_probability:.0%} end after each turn, "
        f"{workload.recompute_share:.0%} of next turns recomputed) on one decode engine of "
        f"{workload.pool_blocks:,} KV blocks; vLLM's TTL {workload.ttl_s:g} s."
    )
    table = Table()
    for col in ("", "fixed TTL", "Boomerang"):
        table.add_column(col, justify="right" if col else "left")
    rows = (
        ("retained block-seconds", f"{fixed.block_seconds:,.0f}", f"{boomerang.block_seconds:,.0f} ({got['block_seconds_share']:.0%})"),
        ("peak retained blocks", f"{fixed.peak_retained_blocks:,}", f"{boomerang.peak_retained_blocks:,}"),
        ("PULL share of next turns", f"{fixed.pull_share:.1%}", f"{boomerang.pull_share:.1%} ({got['pulls_kept']:.1%} of the PULLs kept)"),
        ("requests that waited for memory", f"{fixed.waited:,}", f"{boomerang.waited:,}"),
        ("reads of a released block", f"{fixed.bad_reads}", f"{boomerang.bad_reads}"),
        ("releases by reason", _reasons(fixed), _reasons(boomerang)),
        ("reuse lost to an early release", "—", f"{boomerang.lost_to_release:,}"),
    )
    for row in rows:
        table.add_row(*row)
    console.print(table)
    verdict = "[green]met[/green]" if got["targets_met"] else "[red]NOT met[/red]"
    console.print(f"Targets (block-seconds ≤ {MAX_BLOCK_SECONDS_SHARE:.0%}, ≥ {MIN_PULLS_KEPT:.0%} of PULLs kept, "
                  f"no read of a released block): {verdict}.")
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo-hbm.json").write_text(json.dumps({"workload": asdict(workload), **got}, indent=2, default=str))
    return got


def _reasons(r: HbmResult) -> str:
    return ", ".join(f"{k.lower()} {v:,}" for k, v in sorted(r.released.items())) or "—"


def _database_url(args: argparse.Namespace) -> str:
    return str(args.database_url or os.environ.get("BOOMERANG_DATABASE_URL", ""))


def _check_database(args: argparse.Namespace) -> None:
    """A configured database, checked before the demo spends a minute on what needs none.

    Its migrations are what the first Boomerang deployment would apply; a URL that is malformed,
    a server that cannot be reached or a credential it refuses fails here, in one line
    (`boomerang` words the failure: boomerang_cli.failures)."""
    url = _database_url(args)
    if not url:
        return  # the embedded cluster, started by the first deployment
    try:
        normalize_database_url(url)
    except ValueError as exc:
        raise SystemExit(f"boomerang demo: --database-url {exc}; fix it, or leave it out for an embedded "
                         "database") from None
    logging.getLogger("alembic").setLevel(logging.WARNING)  # its plugin set-up, at INFO
    upgrade(url)


def _run(args: argparse.Namespace) -> int:
    # The tables are wide (a column per mode); piped into a log, rich would fold them to 80
    # columns and cut every figure, so a console that is not a terminal gets room for them.
    console = Console() if sys.stdout.isatty() else Console(width=240)  # a file or pipe: every mode's columns on one line
    logging.getLogger("httpx").setLevel(logging.WARNING)
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    unknown = [p for p in profiles if p not in POINTS]
    if unknown or not profiles:
        raise SystemExit(f"boomerang demo: --profiles: unknown {unknown}; known: {', '.join(POINTS)}")
    if not 1 <= args.reps <= 8:
        raise SystemExit("boomerang demo: --reps must be 1 to 8")
    try:
        modes = parse_modes(args.modes)
    except ValueError as exc:
        raise SystemExit(f"boomerang demo: --modes: {exc}") from None
    _check_database(args)
    if args.grid:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        return run_grid(console, Path(args.data_dir), Path(args.out), _database_url(args), args.time_scale)
    points = {p: (QUICK_POINTS if args.quick else POINTS)[p] for p in profiles}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    console.rule("[bold]Boomerang demo[/bold]: KV-cache reuse in prefill/decode disaggregated serving")
    on = [m.name for m in modes if m.boomerang]
    console.print(
        "Replaying multi-turn agent conversations (system prompt, tool results, the model's own replies) "
        f"to {', '.join(f'{max(points[p]):,} tokens ({p})' for p in profiles)}, first with Boomerang off "
        "(a deployment with no Boomerang in it: the prefill engine recomputes the whole prompt, prefix caching off "
        "as in AWS's tests)"
        + (", then on (it pulls the previous turn's KV back from the decode engine) in each deployment: "
           f"{', '.join(on)}." if on else ".")
        + "".join(f" Then the skeptic's alternative, {m.name}: no Boomerang, prefix caching on the prefill engine "
                  "and sticky routing, with " + ", ".join(map(str, m.quick_levels if args.quick else m.levels))
                  + " conversations sharing that engine." for m in modes if not m.boomerang)
    )
    if args.hbm == "on":
        run_hbm(console, Path(args.out), quick=args.quick)
    run: dict[str, Any] = {"profiles": profiles, "points": points, "result": RunResult(), "stats": {}, "extra": {},
                           "modes": modes, "started": time.monotonic(), "rotations": []}
    # The baseline, then the alternatives to Boomerang: the last deployment's services show the audit trail.
    order = [OFF, *(m for m in modes if not m.boomerang), *(m for m in modes if m.boomerang)]
    for i, mode in enumerate(order):
        code = _run_mode(console, args, run, mode, last=i == len(order) - 1)
        if code is not None:
            return code
    return 1  # not reached: the last mode concludes
