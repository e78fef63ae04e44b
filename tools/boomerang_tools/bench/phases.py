"""The measurements, one function each, over a running `Bench` (see runner.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import time
from collections import Counter
from typing import Any

from boomerang_tools.bench.context import Bench
from boomerang_tools.bench.database import (
    BENCH_EXPIRED_EARLY_SQL,
    BENCH_EXPIRY_LAGS_SQL,
    BENCH_LIVE_BY_TENANT_SQL,
    BENCH_VACUUM_SQL,
    copy_leases,
    rearm_claims,
    sizes,
)
from boomerang_tools.bench.report import floats, summarize
from boomerang_tools.bench.workload import conversation, planned_indices

DEGRADED = "CONTROL_PLANE_DEGRADED"
EXPIRY_TENANT = "bench-expiry"


def _total(results: list[dict[str, Any]], key: str) -> Counter[str]:
    """The client processes' counts under `key`, added up."""
    return sum((Counter(r[key]) for r in results), Counter())


async def preload_to(b: Bench, target: int) -> dict[str, Any]:
    """Preload conversations until `target` live plan-workload leases exist."""
    have = b.preloaded
    if target <= have:
        return {"rows": 0, "seconds": 0.0}
    cfg = b.cfg
    convs = [conversation(k, cfg.tenants, cfg.decode_engines) for k in range(have, target)]
    task = b.progress.add_task(f"preload {have:,} → {target:,} leases", total=len(convs))
    seconds = await copy_leases(b.pg, convs, b.engines.decode, b.margin_seconds,
                                lambda n: b.progress.advance(task, n))
    await b.pg.execute(BENCH_VACUUM_SQL)
    b.progress.remove_task(task)
    b.preloaded = target
    b.copy_rows_per_second = len(convs) / max(seconds, 1e-3)
    return {"rows": len(convs), "seconds": round(seconds, 2), "rows_per_second": round(b.copy_rows_per_second)}


async def plan_step(
    b: Bench, rate: int, seconds: float, label: str, profile: str = "", anonymous: bool = False,
) -> dict[str, Any]:
    """PlanTurn at `rate`/s open loop for `seconds`, from every client process."""
    cfg = b.cfg
    b.step += 1
    pool = planned_indices(0, b.preloaded)
    random.Random(cfg.seed * 1000 + b.step).shuffle(pool)
    per_worker = int(rate * seconds / b.workers.count * 1.3) + 10
    start_at = time.time() + 1.0 + 0.0002 * per_worker  # time to build the requests first
    jobs = [{"kind": "plan", "rate": rate / b.workers.count, "duration": seconds, "seed": b.step,
             "conversations": pool[i :: b.workers.count][:per_worker], "tenants": cfg.tenants,
             "engines": cfg.decode_engines, "start_at": start_at, "anonymous": anonymous}
            for i in range(b.workers.count)]
    label = f"{label}: {rate:,} plans/s for {seconds:g}s"
    results, cpu = await b.run_jobs(jobs, label, start_at, seconds, ("registry", "router"), profile)
    latencies = [x for r in results for x in floats(r["latencies_ms"])]
    lags = [x for r in results for x in floats(r["send_lag_ms"])]
    reasons, errors = _total(results, "reasons"), _total(results, "errors")
    elapsed = max(r["elapsed_s"] for r in results)
    sent = sum(r["sent"] for r in results)
    out: dict[str, Any] = {"rate": rate, **{k: v for k, v in summarize(latencies).items() if k != "count"}}
    lag = summarize(lags)
    out.update(
        plans=sent,
        achieved_rps=round(sent / max(elapsed, 1e-6), 1),
        send_lag_p99_ms=lag["p99_ms"],
        reasons=dict(reasons),
        errors=dict(errors),
        pull_fraction=round(reasons.get("VERIFIED_PREFIX", 0) / max(sent, 1), 4),
        cpu_ms_per_plan={k: round(1000 * v / max(sent, 1), 3) for k, v in cpu.items()},
    )
    out["meets_p99_budget"] = bool(
        out["p99_ms"] <= cfg.p99_budget_ms and not errors and reasons.get(DEGRADED, 0) == 0
        and out["achieved_rps"] >= 0.9 * rate
    )
    b.sample_memory()
    await rearm_claims(b.pg)
    return out


async def plan_rates(b: Bench) -> dict[str, Any]:
    """The fixed rates, then higher ones until p99 passes the budget no more."""
    cfg = b.cfg
    await plan_step(b, 300, min(1.0 if cfg.quick else 2.0, cfg.step_seconds), "warm-up")
    short = min(2.0 if cfg.quick else 3.0, cfg.step_seconds)
    floor = await grpc_floor(b, seconds=short)
    idle = await idle_cpu(b, short)
    cost = await plan_step(b, 200, short if cfg.quick else cfg.step_seconds, "CPU cost per plan")
    cost["idle_cpu_ms_per_s"] = idle
    cost["marginal_cpu_ms_per_plan"] = {
        k: round(max(0.0, v - idle.get(k, 0.0) * (short if cfg.quick else cfg.step_seconds) / max(cost["plans"], 1)), 3)
        for k, v in cost["cpu_ms_per_plan"].items()}
    rates = [await plan_step(b, r, cfg.step_seconds, "plan rate", profile=f"plans-{r}" if r == 1000 else "")
             for r in cfg.rates]
    search = []
    best = max([r["rate"] for r in [cost, *rates] if r["meets_p99_budget"]], default=0)
    if best == max(cfg.rates):
        for rate in cfg.search_rates:
            step = await plan_step(b, rate, cfg.step_seconds, "highest rate with p99 ≤ 5 ms")
            search.append(step)
            if not step["meets_p99_budget"]:
                break
            best = rate
    return {"leases": b.preloaded, "rates": rates, "max_rps_p99_5ms": best, "search": search,
            "clients": b.workers.count, "step_seconds": cfg.step_seconds,
            "cpu_cost": {**capacity(cost, "marginal_cpu_ms_per_plan"), "cpu_ms_per_plan": cost["cpu_ms_per_plan"],
                         "idle_cpu_ms_per_s": idle},
            "low_rate": cost,
            "grpc_floor": floor}


async def lookup_paths(b: Bench, rate: int = 200) -> dict[str, Any]:
    """The claim's two lookups at `rate`, same run, interleaved twice: by conversation id (the
    `(tenant, conversation_id)` index) and without one (the lease the prompt continues, on the
    `(tenant, prompt_key)` index probed with every whole-block key of the prompt)."""
    seconds = b.cfg.path_seconds
    if b.step == 0:  # the run's first plans: open channels and connections first
        await plan_step(b, 300, min(2.0, seconds), "warm-up")
    steps: dict[str, list[dict[str, Any]]] = {"id": [], "no_id": []}
    for order in (("id", "no_id"), ("no_id", "id")):
        for kind in order:
            steps[kind].append(await plan_step(b, rate, seconds, f"lookup {kind}", anonymous=kind == "no_id"))

    def merged(kind: str) -> dict[str, Any]:
        runs = steps[kind]
        cpu = {k: round(sum(r["cpu_ms_per_plan"].get(k, 0.0) for r in runs) / len(runs), 3)
               for k in runs[0]["cpu_ms_per_plan"]}
        return {"p50_ms": round(sum(r["p50_ms"] for r in runs) / len(runs), 3),
                "p99_ms": round(sum(r["p99_ms"] for r in runs) / len(runs), 3),
                "pull_fraction": min(r["pull_fraction"] for r in runs), "cpu_ms_per_plan": cpu,
                "services_cpu_ms_per_plan": round(sum(v for k, v in cpu.items() if k != "clients"), 3)}

    by_id, no_id = merged("id"), merged("no_id")
    return {"leases": b.preloaded, "rate": rate, "id": by_id, "no_id": no_id,
            "p50_delta_ms": round(no_id["p50_ms"] - by_id["p50_ms"], 3),
            "services_cpu_ratio": round(no_id["services_cpu_ms_per_plan"] / max(by_id["services_cpu_ms_per_plan"], 1e-9), 3)}


async def grpc_floor(b: Bench, rate: int = 1000, seconds: float = 3.0) -> dict[str, Any]:
    """CPU of an empty gRPC call (grpc.health.v1 Check on the registry) from the same client
    processes: the floor under every hop of a plan (client → router → registry)."""
    start_at = time.time() + 1.0
    jobs = [{"kind": "health", "target": b.registry_address, "rate": rate / b.workers.count, "duration": seconds,
             "start_at": start_at} for _ in range(b.workers.count)]
    label = f"gRPC floor: {rate:,} empty calls/s"
    results, cpu = await b.run_jobs(jobs, label, start_at, seconds, ("registry",))
    errors = _total(results, "errors")
    sent = sum(r["sent"] for r in results) - sum(errors.values())  # the calls answered
    return {"rate": rate, "calls": sent, "errors": dict(errors),
            "server_cpu_ms_per_call": round(1000 * cpu["registry"] / max(sent, 1), 3),
            "client_cpu_ms_per_call": round(1000 * cpu["clients"] / max(sent, 1), 3)}


async def idle_cpu(b: Bench, seconds: float) -> dict[str, float]:
    """CPU each process uses per second with no load (heartbeats, pool refreshes, pollers)."""
    meter = (await b.cpu_meter("registry", "router")).start()
    await asyncio.sleep(seconds)
    return {k: round(v * 1000 / seconds, 2) for k, v in meter.stop().items()}


def capacity(step: dict[str, Any], key: str) -> dict[str, Any]:
    """What one operation costs in CPU, and the rate that cost allows on this machine's cores
    with nothing else running (the services alone, and with the load generators)."""
    per = step[key]
    services = sum(v for k, v in per.items() if k != "clients")
    cores = os.cpu_count() or 1
    return {"rate": step.get("rate"), key: per, "services_cpu_ms": round(services, 3),
            "capacity_rps_services_only": round(cores * 1000 / services) if services > 0 else None,
            "capacity_rps_with_clients": round(cores * 1000 / (services + per.get("clients", 0.0)))
            if services > 0 else None,
            "degraded_fraction": round(step.get("reasons", {}).get(DEGRADED, 0) / max(step.get("plans", 1), 1), 4)
            if "reasons" in step else None}


async def scale_point(b: Bench, tier: int, step: dict[str, Any] | None) -> dict[str, Any]:
    """Plan latency at `scale_rate` and database size at `tier` live leases."""
    load = await preload_to(b, tier)
    size = await sizes(b.pg)
    if b.step == 0:  # the run's first plans: open channels and connections first
        await plan_step(b, 300, min(2.0, b.cfg.step_seconds), "warm-up")
    if step is None:
        step = await plan_step(b, b.cfg.scale_rate, b.cfg.step_seconds, f"scale {tier:,} leases")
    return {"leases": tier, "rate": step["rate"], "p50_ms": step["p50_ms"], "p99_ms": step["p99_ms"],
            "p999_ms": step["p999_ms"], **size, "preload": load}


async def registrations(b: Bench) -> dict[str, Any]:
    """Acknowledged (committed) registrations per second: RegisterRetainedBlocks from many
    decode-node clients, then RegisterRetainedBlocksBatch from a few batching senders."""
    single = await _registrations(b, b.cfg.register_concurrency, 1)
    single["batched"] = await _registrations(b, 4, 64)
    return single


async def _registrations(b: Bench, concurrency: int, batch: int) -> dict[str, Any]:
    cfg = b.cfg
    # Next turns of conversations whose leases are fillers: each supersedes a live lease.
    pool = [k for k in range(1, b.preloaded, 2)]
    random.Random(cfg.seed).shuffle(pool)
    per_worker = min(len(pool) // b.workers.count, int(12_000 * cfg.register_seconds / b.workers.count) + 100)
    engine_ids = [e.engine_id for e in b.engines.decode]
    start_at = time.time() + 2.0 + 0.00008 * per_worker
    jobs = [{"kind": "register", "conversations": pool[i :: b.workers.count][:per_worker], "tenants": cfg.tenants,
             "engines": cfg.decode_engines, "engine_ids": engine_ids, "generation": b.engines.decode[0].generation,
             "concurrency": concurrency, "batch": batch, "duration": cfg.register_seconds, "start_at": start_at}
            for i in range(b.workers.count)]
    label = (f"registrations: {concurrency * b.workers.count} clients × {batch} per call "
             f"for {cfg.register_seconds:g}s")
    results, cpu = await b.run_jobs(jobs, label, start_at, cfg.register_seconds, ("registry",),
                                    "registrations")
    outcomes = _total(results, "outcomes")
    latencies = [x for r in results for x in floats(r["latencies_ms"])]
    elapsed = max(r["elapsed_s"] for r in results)
    committed = outcomes.get("created", 0)
    b.sample_memory()
    per = {k: round(1000 * v / max(committed, 1), 3) for k, v in cpu.items()}
    cost = capacity({"cpu_ms_per_registration": per}, "cpu_ms_per_registration")
    return {"register_rps": round(committed / max(elapsed, 1e-6), 1), "cpu_cost": cost, "clients": concurrency * len(jobs),
            "per_call": batch,
            "seconds": round(elapsed, 2), "outcomes": dict(outcomes),
            "latency": summarize(latencies), "ran_out_of_requests": any(r["exhausted"] for r in results),
            "cpu_ms_per_registration": per}


async def expiry(b: Bench) -> dict[str, Any]:
    """Lag from deadline to recorded expiry, `expiry_leases` leases due within the window."""
    cfg = b.cfg
    n = cfg.expiry_leases
    base = 90_000_001  # odd: filler chains, apart from the plan workload's conversations
    convs = [dataclasses.replace(conversation(base + 2 * i, cfg.tenants, cfg.decode_engines),
                                 tenant=f"{EXPIRY_TENANT}-{i % 100:02d}") for i in range(n)]
    lead = 2.0 + 1.5 * n / max(b.copy_rows_per_second, 1000.0)
    start = time.time() + lead
    task = b.progress.add_task(f"expiry: preload {n:,} leases due over {cfg.expiry_window_seconds:g}s", total=n)
    await copy_leases(b.pg, convs, b.engines.decode, b.margin_seconds,
                      lambda k: b.progress.advance(task, k), (start, cfg.expiry_window_seconds, n))
    loaded_at = time.time()
    b.progress.remove_task(task)
    end = start + cfg.expiry_window_seconds
    task = b.progress.add_task("expiry: waiting for the reaper", total=n)
    live = n
    while time.time() < end + 30:
        live = int(await b.pg.fetchval(BENCH_LIVE_BY_TENANT_SQL, EXPIRY_TENANT + "%"))
        b.progress.update(task, completed=n - live)
        if live == 0 and time.time() > end:
            break
        await asyncio.sleep(0.5)
    b.progress.remove_task(task)
    lags = [float(r[0]) for r in await b.pg.fetch(BENCH_EXPIRY_LAGS_SQL, EXPIRY_TENANT + "%")]
    early = int(await b.pg.fetchval(BENCH_EXPIRED_EARLY_SQL, EXPIRY_TENANT + "%"))
    summary = summarize([x * 1000 for x in lags])
    b.sample_memory()
    return {
        "leases": n, "window_seconds": cfg.expiry_window_seconds, "expired": len(lags), "still_live": live,
        "expired_early": early, "loaded_before_first_deadline": loaded_at < start,
        "lag_p50_s": round(summary["p50_ms"] / 1000, 4) if lags else None,
        "lag_p99_s": round(summary["p99_ms"] / 1000, 4) if lags else None,
        "lag_max_s": round(summary["max_ms"] / 1000, 4) if lags else None,
    }
