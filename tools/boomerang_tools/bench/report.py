"""`bench-report.json` (the issue's shape, plus detail) and its Markdown summary; the latency
summaries behind it: percentiles over raw samples (no histogram rounding)."""

from __future__ import annotations

import json
import math
import time
from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from boomerang_tools.bench.context import BenchConfig


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0–100) of already sorted values, nearest-rank; NaN when empty."""
    if not sorted_values:
        return math.nan
    # Rounded first: 99.9 / 100 * 1000 is 999.0000000000001 in floating point.
    rank = max(1, math.ceil(round(q / 100 * len(sorted_values), 9)))
    return float(sorted_values[min(rank, len(sorted_values)) - 1])


def summarize(values_ms: Iterable[float]) -> dict[str, float]:
    """p50, p99, p99.9, mean and max of latencies in milliseconds (rounded to µs)."""
    ordered = sorted(values_ms)
    if not ordered:
        return {"count": 0, "p50_ms": math.nan, "p99_ms": math.nan, "p999_ms": math.nan,
                "mean_ms": math.nan, "max_ms": math.nan}
    return {
        "count": len(ordered),
        "p50_ms": round(percentile(ordered, 50), 3),
        "p99_ms": round(percentile(ordered, 99), 3),
        "p999_ms": round(percentile(ordered, 99.9), 3),
        "mean_ms": round(sum(ordered) / len(ordered), 3),
        "max_ms": round(ordered[-1], 3),
    }


def clean(value: object) -> object:
    """`value` with NaN and infinities replaced by None, recursively (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def floats(raw: bytes) -> list[float]:
    """The float64 samples a client process sent back packed (`array("d").tobytes()`)."""
    out = array("d")
    out.frombytes(raw)
    return out.tolist()


# The targets on this 2-core machine (issue 8; docs/design.md, "Where the time goes").
TARGETS = {
    "plan_p50_ms_at_1000": ("plan p50 at 1,000/s, 100k leases", "≤", 1.0),
    "plan_p99_ms_at_1000": ("plan p99 at 1,000/s, 100k leases", "≤", 5.0),
    "max_rps_p99_5ms": ("plans/s with p99 ≤ 5 ms", "≥", 3000),
    "register_rps": ("committed registrations/s", "≥", 5000),
    "register_batched_rps": ("committed registrations/s, 64 per RegisterRetainedBlocksBatch", "≥", 5000),
    "expiry_lag_p99_s": ("expiry lag p99, s", "≤", 1.0),
    "gateway_overhead_ratio": ("gateway overhead / naive proxy's (p50)", "≤", 1.5),
    "hook_overhead_ratio": ("hook mode: added time / naive proxy's (p50)", "≤", 1.1),
    # Issue 13: Boomerang's own cost against what it delivers.
    "plan_pull_at_1000": ("plans that PULL at 1,000/s, 100k leases", "≥", 0.99),
    "plan_cpu_ratio": ("plan CPU (router + registry + Postgres) / one empty gRPC round trip's", "≤", 1.5),
    "turn_cpu_ms": ("control-plane CPU per turn through the gateway (gateway-only), ms", "≤", 6.0),
    "hook_turn_cpu_ms": ("control-plane CPU per turn, hook mode (gateway, router, registry, reaper, Postgres), ms",
                         "≤", 3.0),
    "agents_pull_share": ("64 agents through the gateway: later turns that PULL", "≥", 0.95),
    "agents_failed": ("64 agents through the gateway: failed turns", "≤", 0),
    # Issue 21: with plans in flight, the prefill scheduler never waits for Boomerang.
    "hook_step_max_ms_far": ("the hook's worst time in one schedule() step, plans in flight, router 120 ms away, ms",
                             "≤", 1.0),
    # Issue 23: finding the lease a prompt continues, without a conversation id.
    "lookup_p50_delta_ms": ("plan p50 without an id − with one, 200/s, 100k leases, ms", "≤", 0.5),
    "lookup_cpu_ratio": ("service CPU per plan without an id / with one", "≤", 1.1),
    # Issue 31: a turn that cannot pull does not wait.
    "first_turn_delta_ms": (("a first turn with nothing to pull: TTFT on − off, worst p50 of both paths, with an "
                             "id and without, 2k and 24k, ms"), "≤", 1.0),
}


def _plan_cpu_ratio(plan: dict[str, Any]) -> float | None:
    """Service CPU per plan over the CPU (server + client) of one empty gRPC call, same run."""
    cost, floor = plan.get("cpu_cost") or {}, plan.get("grpc_floor") or {}
    empty = (floor.get("server_cpu_ms_per_call") or 0) + (floor.get("client_cpu_ms_per_call") or 0)
    services = cost.get("services_cpu_ms")
    return round(services / empty, 3) if services is not None and empty > 0 else None


def _targets(report: dict[str, Any]) -> dict[str, Any]:
    at_1000: dict[str, Any] = next((r for r in report["plan"]["rates"] if r["rate"] == 1000), {})
    control: dict[str, Any] = report.get("control_plane") or {}
    control_hook: dict[str, Any] = report.get("control_plane_hook") or {}
    values = {
        "plan_p50_ms_at_1000": at_1000.get("p50_ms"),
        "plan_p99_ms_at_1000": at_1000.get("p99_ms"),
        "max_rps_p99_5ms": report["plan"]["max_rps_p99_5ms"],
        "register_rps": report["register_rps"],
        "register_batched_rps": (report.get("register") or {}).get("batched", {}).get("register_rps"),
        "expiry_lag_p99_s": report["expiry_lag_p99_s"],
        "gateway_overhead_ratio": report["gateway_overhead"]["ratio"],
        "hook_overhead_ratio": report["gateway_overhead"].get("hook_ratio"),
        "plan_pull_at_1000": at_1000.get("pull_fraction"),
        "plan_cpu_ratio": _plan_cpu_ratio(report["plan"]),
        "turn_cpu_ms": control.get("cpu_ms_per_turn_total"),
        "hook_turn_cpu_ms": control_hook.get("cpu_ms_per_turn_total"),
        "agents_pull_share": control.get("agents_pull_share"),
        "agents_failed": control.get("agents_failed"),
        "hook_step_max_ms_far": ((report.get("hook_schedule") or {}).get("far") or {}).get("background", {}).get("max_ms"),
        "lookup_p50_delta_ms": (report.get("lookup_paths") or {}).get("p50_delta_ms"),
        "lookup_cpu_ratio": (report.get("lookup_paths") or {}).get("services_cpu_ratio"),
        "first_turn_delta_ms": max((r["delta_p50_ms"] for r in (report.get("first_turns") or {}).values()),
                                   default=None),
    }
    out = {}
    for key, (label, op, goal) in TARGETS.items():
        value = values[key]
        met = value is not None and (value <= goal if op == "≤" else value >= goal)
        out[key] = {"label": label, "target": f"{op} {goal:g}", "value": value, "met": bool(met)}
    return out


def build_report(
    cfg: BenchConfig, results: dict[str, Any], memory: dict[str, dict[str, float]], host: dict[str, Any],
    database: dict[str, str], started: float, finished: float,
) -> dict[str, Any]:
    """The report: the issue's keys first, then everything useful."""
    register = results.get("register") or {"register_rps": None}
    expiry = results.get("expiry") or {"lag_p99_s": None}
    report: dict[str, Any] = {
        "plan": results.get("plan") or {"leases": cfg.leases, "rates": [], "max_rps_p99_5ms": None, "search": []},
        "register_rps": register["register_rps"],
        "expiry_lag_p99_s": expiry["lag_p99_s"],
        "gateway_overhead": results.get("gateway_overhead") or {"boomerang_p50_ms": None, "naive_p50_ms": None,
                                                                "ratio": None},
        **{key: results.get(key) for key in ("lookup_paths", "control_plane", "control_plane_hook",
                                             "pulled_turn_stages", "first_turns", "hook_schedule")},
        "scale": results["scale"],
        "memory_mb": {name: m["peak_rss_mb"] for name, m in sorted(memory.items())},
        "register": register,
        "expiry": expiry,
        "phases": sorted(cfg.phases),
        "memory_detail_mb": memory,
        "preload": results.get("preload"),
        "timings_s": results.get("timings_s"),
        "quick": cfg.quick,
        "machine": host,
        "database": database,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_s": round(finished - started, 1),
        "method": {
            "plans": f"open-loop Poisson arrivals from {cfg.clients} client processes; each plan's prompt extends "
                     "a live lease's tokens (the registry verifies the prefix and the plan PULLs); claimed leases "
                     "are given back between steps so every step claims afresh",
            "registrations": "closed loop, each call the next turn of a conversation (superseding its lease), "
                             "counted when acknowledged (after commit)",
            "expiry": "lag_seconds the registry records in each TTL_EXPIRED event (database clock)",
            "hook_schedule": "the vLLM hook's own code (BoomerangHook) driven as a prefill engine's loop drives it: "
                             "the next turns of live preloaded conversations arrive at a steady rate and every 2 ms a step asks the hook about "
                             "each waiting one; per step, the time those calls took (what the hook adds to "
                             "schedule()), over the steps with plans in flight; the router near, then 120 ms away "
                             "through a relay delaying what the engine sends; beside it, on the same kind of "
                             "requests, the synchronous plan the hook made before (chain, then a blocking PlanTurn "
                             "within plan_deadline_ms, per new request, inside its step)",
            "gateway_overhead": "turn time (send to last streamed byte) less the direct path's, same run, "
                                "interleaved; ratio = Boomerang's added time / the naive proxy's; hook mode: "
                                "the --engine-hook gateway over a second pair of engines running the vLLM hook "
                                "(sim --hook), less the direct path to that pair, against the naive proxy over it",
        },
    }
    report["targets"] = _targets(report)
    return clean(report)  # type: ignore[return-value]


def _ms(value: Any) -> str:
    return "—" if value is None else f"{value:,.2f}"


def _count(value: Any) -> str:
    return "—" if value is None else f"{value:,}"


def _cpu(per: dict[str, float] | None) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in (per or {}).items()) or "—"


def lookup_lines(look: dict[str, Any]) -> list[str]:
    """The claim's lookup by conversation id beside the one without (issue 23), same run."""
    lines = ["", "## Finding the lease: by conversation id → by the prompt it continues (same run, interleaved)", "",
             (f"{look['leases']:,} live leases, {look['rate']}/s open loop, two steps each, interleaved. Without an "
              "id the claim probes the tenant's `(tenant, prompt_key)` index with every whole-block key of the "
              "prompt and proves the continuation (chain and the prompt's partial block) in the same statement."),
             "", "| lookup | p50 ms | p99 ms | PULL | service CPU ms per plan |", "|---|---|---|---|---|"]
    for key, name in (("id", "conversation id"), ("no_id", "no id (the prompt)")):
        r = look[key]
        lines.append(f"| {name} | {_ms(r['p50_ms'])} | {_ms(r['p99_ms'])} | {r['pull_fraction']:.0%} | "
                     f"{r['services_cpu_ms_per_plan']:.3f} |")
    return lines


def hook_schedule_lines(hs: dict[str, Any]) -> list[str]:
    """The prefill scheduler step with plans in flight: the hook's time per step, before and after."""
    lines = ["", (f"## The prefill engine's schedule() with plans in flight (next turns of live conversations, "
                  f"plan_deadline_ms {hs['plan_deadline_ms']:g}, a step every {hs['step_ms']:g} ms)"), "",
             "| router | plans | steps | p50 ms | p99 ms | max ms |", "|---|---|---|---|---|---|"]
    for where in ("near", "far"):
        run = hs[where]
        for key, name in (("synchronous_before", "synchronous (before)"), ("background", "in the background (now)")):
            r = run[key]
            lines.append(f"| {run['router_delay_ms']:g} ms away | {name} | {r['steps']} | {_ms(r['p50_ms'])} | "
                         f"{_ms(r['p99_ms'])} | {_ms(r['max_ms'])} |")
    for where, label in (("near", "near"), ("far", "120 ms away")):
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(hs[where]["plans"].items()))
        lines += ["", f"The hook's plans with the router {label}, now: {outcomes or 'none'}."]
    return lines


# A pulled turn of Qwen3-32B on one H200 (docs/performance.md, measured): suffix prefill and copy, ms.
H200_PULLED_TURN_MS = {"2000": 76.0, "24000": 187.0}


def pulled_turn_lines(st: dict[str, Any]) -> list[str]:
    """The pulled turn, stage by stage: p50 wall ms of each stage on the turn's path, the means
    inside the router and the registry, CPU ms per turn, and the share of an H200 pulled turn."""
    if not st.get("contexts"):
        return []
    lines = ["", "## A pulled turn, stage by stage", "",
             ("Sequential conversations, later turns, p50 ms. *On the path* is what the turn waits for before "
             "its prefill starts: tokenize + plan through the gateway, the engine's PlanTurn wait with the hook; "
             "*share* is that against the same turn pulled on an H200 (76 ms at 2k, 187 ms at 24k). Router and "
             "registry: means inside them (the router's plan holds the registry's claim)."),
             "",
             ("| context | path | tokenize | plan | on the path | share of H200 turn | router plan | registry claim "
             "| CPU ms/turn | plans |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for context, paths in st["contexts"].items():
        h200 = H200_PULLED_TURN_MS.get(context)
        for name, r in paths.items():
            stages = r.get("stages_ms") or {}
            on_path = (stages.get("tokenize", 0.0) + stages.get("plan", 0.0)) if name == "gateway" \
                else r.get("engine_plan_ms_p50")
            share = f"{on_path / h200:.1%}" if on_path is not None and h200 else "—"
            lines.append(
                f"| {int(context):,} | {name} | {_ms(stages.get('tokenize'))} | {_ms(stages.get('plan'))} | "
                f"**{_ms(on_path)}** | {share} | {_ms(r.get('router_plan_mean_ms'))} | "
                f"{_ms(r.get('registry_claim_mean_ms'))} | {r['cpu_ms_per_turn_total']:.2f} ({_cpu(r['cpu_ms_per_turn'])}) "
                f"| {', '.join(f'{k} {v}' for k, v in {**(r.get('plans') or {}), **(r.get('errors') or {})}.items())} |")
    chain = ", ".join(f"{int(c):,} tokens {v:.2f} ms" for c, v in st.get("chain_ms", {}).items())
    lines += ["", f"The prompt's token chain, built here with the router's function: {chain}."]
    return lines


def first_turn_lines(first: dict[str, Any]) -> list[str]:
    """A first turn with nothing to pull, with Boomerang on and off: p50 TTFT and the paired difference."""
    if not first:
        return []
    lines = ["", "## A first turn with nothing to pull", "",
             ("New conversations, one request at a time, each with Boomerang on and off, in turn first "
              "(`X-Boomerang-Reuse: off`, the same gateway and engines, `--time-scale 0`); p50 ms."),
             "", "| context | path | conversation id | TTFT on | TTFT off | on − off (p50 of pairs) |",
             "|---|---|---|---|---|---|"]
    for key, r in first.items():
        context, path, ids = key.split("/")
        lines.append(f"| {int(context):,} | {path} | {ids} | {_ms(r['on_p50_ms'])} | {_ms(r['off_p50_ms'])} | "
                     f"**{r['delta_p50_ms']:+.2f}** |")
    return lines


def markdown(report: dict[str, Any]) -> str:
    """The human summary."""
    m = report["machine"]
    plan = report["plan"]
    lines = [
        f"# Boomerang benchmark{' (--quick)' if report['quick'] else ''}",
        "",
        (f"{report['started_at']}, {report['duration_s']:.0f} s on {m['cpus']} CPUs ({m['cpu_model']}), "
         f"{m['memory_gb']} GB, Python {m['python']}, PostgreSQL {report['database'].get('version', '?')} "
         f"({report['database'].get('server', '')}); load average at start {m['load_avg_at_start'][0]:.1f}."),
        "",
        "## Targets",
        "",
        "| target | goal | measured | |",
        "|---|---|---|---|",
    ]
    for t in report["targets"].values():
        value = t["value"]
        shown = "—" if value is None else (f"{value:,.3f}" if isinstance(value, float) else f"{value:,}")
        lines.append(f"| {t['label']} | {t['target']} | {shown} | {'met' if t['met'] else '**not met**'} |")
    if plan["rates"]:
        lines += ["", f"## PlanTurn at {plan['leases']:,} live leases ({plan['clients']} client processes, open loop)",
                  "", "| rate/s | achieved/s | p50 ms | p99 ms | p99.9 ms | PULL | degraded | p99 ≤ 5 ms | CPU ms per plan |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in [x for x in [plan.get("low_rate")] if x] + plan["rates"] + plan["search"]:
            degraded = r["reasons"].get("CONTROL_PLANE_DEGRADED", 0) + sum(r["errors"].values())
            lines.append(f"| {r['rate']:,} | {r['achieved_rps']:,.0f} | {_ms(r['p50_ms'])} | {_ms(r['p99_ms'])} | "
                         f"{_ms(r['p999_ms'])} | {r['pull_fraction']:.0%} | {degraded / max(r['plans'], 1):.0%} | "
                         f"{'yes' if r['meets_p99_budget'] else 'no'} | {_cpu(r.get('cpu_ms_per_plan'))} |")
        lines += ["", f"Highest rate with p99 ≤ 5 ms: **{plan['max_rps_p99_5ms']:,}/s**."]
        cost = plan.get("cpu_cost")
        if cost:
            idle = ", ".join(f"{k} {v:.0f}" for k, v in cost["idle_cpu_ms_per_s"].items())
            lines += ["", (f"CPU per plan at {cost['rate']}/s ({cost['degraded_fraction']:.0%} degraded), idle use "
                           f"({idle} ms per second) taken out: {_cpu(cost['marginal_cpu_ms_per_plan'])} ms — the "
                           f"services' {cost['services_cpu_ms']:.2f} ms allow at "
                           f"most {_count(cost['capacity_rps_services_only'])} plans/s on {m['cpus']} cores with "
                           f"nothing else running ({_count(cost['capacity_rps_with_clients'])}/s with the load "
                           "generators on the same cores).")]
        floor = plan.get("grpc_floor")
        if floor:
            hops = 2 * (floor["server_cpu_ms_per_call"] + floor["client_cpu_ms_per_call"])
            lines += ["", (f"The floor under that: one empty gRPC call (grpc.health.v1 Check, {floor['rate']:,}/s) "
                           f"costs {floor['server_cpu_ms_per_call']:.2f} ms of server CPU and "
                           f"{floor['client_cpu_ms_per_call']:.2f} ms of client CPU here; a plan crosses two hops "
                           f"(client → router → registry), {hops:.2f} ms before any work"
                           + (f" ({_count(sum(floor['errors'].values()))} calls failed, by code "
                              f"{floor['errors']}, left out)." if floor.get("errors") else "."))]
    if report.get("lookup_paths"):
        lines += lookup_lines(report["lookup_paths"])
    if report.get("hook_schedule"):
        lines += hook_schedule_lines(report["hook_schedule"])
    if report["scale"]:
        lines += ["", "## Scale", "",
                  "| live leases | p50 ms | p99 ms | p99.9 ms | database MB | leases MB | lease indexes MB | audit MB |",
                  "|---|---|---|---|---|---|---|---|"]
        for x in report["scale"]:
            lines.append(f"| {x['leases']:,} | {_ms(x['p50_ms'])} | {_ms(x['p99_ms'])} | {_ms(x['p999_ms'])} | "
                         f"{x['db_size_mb']:,} | {x['leases_table_mb']:,} | {x['lease_indexes_mb']:,} | "
                         f"{x['lease_events_mb']:,} |")
    reg, exp, gw = report["register"], report["expiry"], report["gateway_overhead"]
    lines += ["", "## Registrations, expiry, gateway", ""]
    if reg.get("register_rps") is not None:
        lines.append(f"- Committed RegisterRetainedBlocks: **{reg['register_rps']:,.0f}/s** from {reg['clients']} "
                     f"concurrent clients (p50 {_ms(reg['latency']['p50_ms'])} ms, p99 {_ms(reg['latency']['p99_ms'])} ms; "
                     f"CPU ms per registration: {_cpu(reg.get('cpu_ms_per_registration'))}; at most "
                     f"{_count(reg['cpu_cost']['capacity_rps_services_only'])}/s on these cores for the services alone).")
    batched = reg.get("batched") or {}
    if batched.get("register_rps") is not None:
        lines.append(f"- The same through RegisterRetainedBlocksBatch, {batched['per_call']} per call from "
                     f"{batched['clients']} senders: **{batched['register_rps']:,.0f}/s** (call p50 "
                     f"{_ms(batched['latency']['p50_ms'])} ms; CPU ms per registration: "
                     f"{_cpu(batched.get('cpu_ms_per_registration'))}).")
    if exp.get("lag_p99_s") is not None:
        lines.append(f"- Expiry of {exp['leases']:,} leases due within {exp['window_seconds']:g} s: lag p50 "
                     f"{exp['lag_p50_s']} s, p99 **{exp['lag_p99_s']} s**, max {exp['lag_max_s']} s; "
                     f"{exp['expired']:,} expired, {exp['expired_early']} early, {exp['still_live']} left live.")
    if gw.get("boomerang_p50_ms") is not None:
        turn = gw["turn_ms"]
        lines.append(f"- Gateway overhead over calling the engines directly (turn p50 {_ms(turn['direct']['p50_ms'])} ms): "
                     f"p50 **{_ms(gw['boomerang_p50_ms'])} ms** vs the naive proxy's {_ms(gw['naive_p50_ms'])} ms "
                     f"(ratio **{gw['ratio']}**); p99 {_ms(gw['boomerang_p99_ms'])} ms vs {_ms(gw['naive_p99_ms'])} ms "
                     f"(ratio {gw['ratio_p99']}); {sum(x['count'] for x in turn.values()):,} turns.")
    if gw.get("hook_p50_ms") is not None:
        lines.append(f"- Hook mode (`--engine-hook` gateway over engines running the vLLM hook) over the direct path "
                     f"to those engines (turn p50 {_ms(turn['direct-hook']['p50_ms'])} ms): p50 "
                     f"**{_ms(gw['hook_p50_ms'])} ms** vs the naive proxy's {_ms(gw['naive_hook_p50_ms'])} ms over them "
                     f"(ratio **{gw['hook_ratio']}**); p99 {_ms(gw['hook_p99_ms'])} ms vs "
                     f"{_ms(gw['naive_hook_p99_ms'])} ms (ratio {gw['hook_ratio_p99']}).")
    if gw.get("end_of_turn_added_p50_ms") is not None:
        ends = gw["end_of_turn_ms"]["boomerang"]
        lines.append(f"- End of a turn through the gateway (finishing chunk to `[DONE]`, which waits for ReportTurn's "
                     f"answer: the next turn's lease committed): p50 {_ms(ends['p50_ms'])} ms, p99 {_ms(ends['p99_ms'])} ms; "
                     f"added over the direct path: p50 **{_ms(gw['end_of_turn_added_p50_ms'])} ms**, "
                     f"p99 **{_ms(gw['end_of_turn_added_p99_ms'])} ms** (on the end of the turn, not on TTFT).")
    cp = report.get("control_plane") or {}
    if cp.get("cpu_ms_per_turn_total") is not None:
        lines.append(f"- Whole control plane through the gateway ({cp['mode']}), sequential conversations, idle use "
                     f"taken out: **{cp['cpu_ms_per_turn_total']:.2f} ms** CPU per turn ({_cpu(cp['cpu_ms_per_turn'])}; "
                     f"{cp['turns']:,} turns).")
    cph = report.get("control_plane_hook") or {}
    if cph.get("cpu_ms_per_turn_total") is not None:
        lines.append(f"- Whole control plane in {cph['mode']}, sequential conversations, idle use taken out: "
                     f"**{cph['cpu_ms_per_turn_total']:.2f} ms** CPU per turn ({_cpu(cph['cpu_ms_per_turn'])}; "
                     f"{cph['turns']:,} turns; the hooked engines, simulator and hook together: "
                     f"{_cpu(cph.get('engines_cpu_ms_per_turn'))}; engine plans {cph.get('engine_plans')}; for scale, "
                     f"the naive proxy over those engines: {_ms(cph.get('naive_proxy_cpu_ms_per_turn'))} ms per turn).")
    if cp.get("agents_later_turns"):
        lines.append(f"- {cp['agents']} agents at once through the gateway: {cp['agents_turns']:,} turns "
                     f"({cp['agents_turns_per_s']:,.0f}/s), of the {cp['agents_later_turns']:,} later turns "
                     f"**{cp['agents_pull_share']:.1%}** PULL ({', '.join(f'{k} {v}' for k, v in cp['agents_plans'].items())}); "
                     f"**{cp['agents_failed']}** failed.")
        if cp.get("agents_degraded_by"):
            lines.append("  Without reuse, by the services' counters (gateway: no plan, by cause; router: planned "
                         "without the claim's answer, by why): "
                         + ", ".join(f"{k} {v}" for k, v in cp["agents_degraded_by"].items()) + ".")
    lines += pulled_turn_lines(report.get("pulled_turn_stages") or {})
    lines += first_turn_lines(report.get("first_turns") or {})
    if report["memory_mb"]:
        lines += ["", "## Memory (peak RSS, MB)", "", ", ".join(f"{k} {v:,.0f}" for k, v in report["memory_mb"].items())]
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """Write `bench-report.json` and `bench-report.md`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "bench-report.json", out_dir / "bench-report.md"
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    md_path.write_text(markdown(report))
    return json_path, md_path
