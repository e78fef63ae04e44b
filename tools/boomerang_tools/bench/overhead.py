"""Gateway overhead: the gateway and the naive proxy side by side over the same engines, and
hook mode beside them: a gateway with `--engine-hook` in front of engines that run the vLLM
hook (`sim --hook`), which plan with the router and register with the registry themselves."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
from boomerang.clients.router import RouterClient
from boomerang.v1 import router_service_pb2 as rtpb
from prometheus_client.parser import text_string_to_metric_families

from boomerang_tools.bench.context import GATEWAY_ENV, SIM_MODEL, Bench
from boomerang_tools.bench.stats import floats, summarize
from boomerang_tools.bench.turns import PATHS

# The hooked engines serve the same profile under a name of their own, so each gateway's
# turns reach only its own pair of engines.
HOOK_MODEL = "bench-hook/Qwen3-32B"


# Why turns of the agents phase went without reuse, from the services' own counters.
DEGRADE_COUNTERS = {
    "gateway": ("boomerang_gateway_fallbacks", "cause"),  # the gateway did not get a plan
    "router": ("boomerang_router_claims_unanswered", "why"),  # the router planned without the claim
}


async def _counters(http: httpx.AsyncClient, urls: dict[str, str]) -> dict[str, float]:
    """DEGRADE_COUNTERS as `service:label` → value, read from each service's /metrics."""
    out: dict[str, float] = {}
    for service, url in urls.items():
        name, label = DEGRADE_COUNTERS[service]
        for family in text_string_to_metric_families((await http.get(url)).text):
            if family.name == name:
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        out[f"{service}:{sample.labels[label]}"] = sample.value
    return out


async def _wait_engines(gateway: str, router: str, timeout: float = 30.0, model: str = SIM_MODEL) -> None:
    """Until the router's pool and the gateway both see the simulated engines."""
    deadline = time.monotonic() + timeout
    async with RouterClient(router, timeout=2.0) as client, httpx.AsyncClient(timeout=2.0) as http:
        while time.monotonic() < deadline:
            try:
                listed = await client.list_engines(rtpb.RouterServiceListEnginesRequest(model=model))
                health = (await http.get(gateway + "/health")).json()
                if sum(1 for e in listed.engines if e.available) >= 2 and int(health.get("models", 0)) >= 1:
                    return
            except Exception:  # noqa: BLE001 - not yet
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError("the router and gateway did not see the simulated engines in time")


def _ratio(a: float, b: float) -> float | None:
    """a / b; None when either added time is below zero (under this run's noise: no ratio)."""
    return round(a / b, 3) if b > 0 and a >= 0 else None


def _merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Turn jobs that ran different paths, as one result."""
    out: dict[str, Any] = {"times_ms": {}, "ends_ms": {}, "stages_ms": {}, "plans": {}, "hook_plans": {},
                           "reused": {}, "errors": {}, "turns": {}}
    for r in results:
        for key in ("times_ms", "ends_ms", "stages_ms"):
            for name, data in r[key].items():
                out[key][name] = out[key].get(name, b"") + data
        for key in ("plans", "hook_plans", "reused", "errors", "turns"):
            for name, n in r.get(key, {}).items():
                out[key][name] = out[key].get(name, 0) + n
    return out


async def gateway_overhead(b: Bench) -> dict[str, Any]:
    """Turns through the gateway, the naive proxy and directly, interleaved; what each adds."""
    cfg = b.cfg
    s = b.services
    run = uuid.uuid4().hex[:6]
    task = b.progress.add_task("gateway overhead: starting engines, gateway, naive proxy", total=None)
    common = ["--port", "0", "--registry", b.registry_address, "--time-scale", "0", "--heartbeat-seconds", "1"]
    s.start("sim-prefill", ["sim", "--role", "prefill", "--engine-id", f"bench-sim-p-{run}", *common])
    s.start("sim-decode", ["sim", "--role", "decode", "--engine-id", f"bench-sim-d-{run}", *common])
    prefill, decode = (f"http://{a}" for a in await s.ready("sim-prefill", "sim-decode"))
    if not cfg.control_plane:  # else the gateway runs in the control plane's process (context.py)
        s.start("gateway", ["gateway", "--listen", "127.0.0.1:0", "--router", b.router_address, "--registry",
                            b.registry_address], GATEWAY_ENV)
    s.start("naive-proxy", ["bench", "--serve-naive-proxy", "127.0.0.1:0", "--prefill", prefill, "--decode", decode])
    # Hook mode: the engines plan (PlanTurn from P's own token ids) and register (D's sender,
    # RegisterRetainedBlocksBatch) themselves; the gateway only routes. The planning budget is
    # `boomerang up --hook`'s (250 ms), not the hook's 20 ms default for real hosts. At
    # --time-scale 0 the engines compute nothing, so what a pull would save is moot: a token is
    # valued high enough that every plan may be waited for up to that budget, and the turn
    # measures the plan's own latency (at the profile's 0.02 ms a token a short bench prompt
    # waited ~10 ms, and on a busy host every plan came too late: no turn pulled).
    hook_args = ["--hook", "--router", b.router_address, "--plan-deadline-ms", "250", "--plan-wait-share", "1",
                 "--prefill-ms-per-token", "1000", "--served-model-name", HOOK_MODEL]
    s.start("sim-prefill-hook", ["sim", "--role", "prefill", "--engine-id", f"bench-sim-hp-{run}", *common, *hook_args])
    s.start("sim-decode-hook", ["sim", "--role", "decode", "--engine-id", f"bench-sim-hd-{run}", *common, *hook_args])
    await s.ready("sim-prefill-hook", "sim-decode-hook")
    s.start("gateway-hook", ["gateway", "--listen", "127.0.0.1:0", "--router", b.router_address, "--registry",
                             b.registry_address, "--allow-anonymous", "--engine-hook"])
    prefill_hook, decode_hook = (f"http://{a}" for a in [s.children[n].address for n in HOOKED_ENGINES])
    s.start("naive-proxy-hook", ["bench", "--serve-naive-proxy", "127.0.0.1:0", "--prefill", prefill_hook,
                                 "--decode", decode_hook])
    naive, hook, naive_hook = (f"http://{a}" for a in await s.ready("naive-proxy", "gateway-hook", "naive-proxy-hook"))
    gateway = b.gateway_url = f"http://{await asyncio.to_thread(s.children['gateway'].wait_ready, 60.0, 'gateway')}"
    await _wait_engines(gateway, b.router_address)
    await _wait_engines(hook, b.router_address, model=HOOK_MODEL)
    b.progress.update(task, description=f"gateway overhead: turns on 6 paths for {cfg.gateway_seconds:g}s")
    job = {"kind": "turns", "gateway": gateway, "naive": naive, "prefill": prefill, "decode": decode,
           "hook": hook, "hook_model": HOOK_MODEL, "naive_hook": naive_hook, "prefill_hook": prefill_hook,
           "decode_hook": decode_hook,
           "model": SIM_MODEL, "duration": cfg.gateway_seconds, "start_at": time.time() + 0.5,
           "slots": cfg.gateway_slots, "turns_per_conversation": 6, "words": 40, "max_tokens": 16,
           "think_seconds": 0.02}
    # Each engine pair's three paths from a load-generator process of its own, as many
    # conversations per process as before hook mode was measured: the direct path does
    # the P→D hand-off in the client, so a client process short of CPU slows it most.
    jobs = [{**job, "paths": ["direct", "naive", "boomerang"]}, {**job, "paths": ["direct-hook", "naive-hook", "hook"]}]
    running = asyncio.ensure_future(b.workers.run(jobs, timeout=cfg.gateway_seconds + 120))
    await asyncio.sleep(0.5)
    sampler = b.sampler("turns", ("gateway", "naive-proxy", "router", "registry", "gateway-hook", "sim-prefill-hook"),
                        cfg.gateway_seconds)
    result = _merge(await running)
    await b.collect("turns", sampler)
    b.progress.remove_task(task)
    b.sample_memory()
    paths = {p: summarize(floats(result["times_ms"][p])) for p in PATHS}
    stages = {k: summarize(floats(v)) for k, v in result["stages_ms"].items()}
    direct = paths["direct"]
    add = {p: {q: round(paths[p][f"{q}_ms"] - direct[f"{q}_ms"], 3) for q in ("p50", "p99")} for p in ("naive", "boomerang")}
    # Hook mode against its own pair of engines' direct path and naive proxy.
    add |= {p: {q: round(paths[p][f"{q}_ms"] - paths["direct-hook"][f"{q}_ms"], 3) for q in ("p50", "p99")}
            for p in ("naive-hook", "hook")}
    # A turn's end: finishing chunk to the end of the stream. The gateway holds `[DONE]`
    # until ReportTurn is answered; what that adds is its end less the direct path's.
    ends = {p: summarize(floats(result.get("ends_ms", {}).get(p, b""))) for p in PATHS}
    end_added = {q: round(ends["boomerang"][f"{q}_ms"] - ends["direct"][f"{q}_ms"], 3)
                 if ends["boomerang"]["count"] and ends["direct"]["count"] else None for q in ("p50", "p99")}
    return {
        "boomerang_p50_ms": add["boomerang"]["p50"],
        "naive_p50_ms": add["naive"]["p50"],
        "ratio": _ratio(add["boomerang"]["p50"], add["naive"]["p50"]),
        "boomerang_p99_ms": add["boomerang"]["p99"],
        "naive_p99_ms": add["naive"]["p99"],
        "ratio_p99": _ratio(add["boomerang"]["p99"], add["naive"]["p99"]),
        # Hook mode: the hook gateway's turns less the direct path's over the same hooked
        # engines (no conversation id there: the hook does nothing): all that Boomerang adds,
        # the engines' own PlanTurn and registration included; against the naive proxy's over
        # those engines.
        "hook_p50_ms": add["hook"]["p50"],
        "naive_hook_p50_ms": add["naive-hook"]["p50"],
        "hook_ratio": _ratio(add["hook"]["p50"], add["naive-hook"]["p50"]),
        "hook_p99_ms": add["hook"]["p99"],
        "naive_hook_p99_ms": add["naive-hook"]["p99"],
        "hook_ratio_p99": _ratio(add["hook"]["p99"], add["naive-hook"]["p99"]),
        "hook_plans": result.get("hook_plans", {}),
        "turn_ms": paths,
        "end_of_turn_ms": ends,
        "end_of_turn_added_p50_ms": end_added["p50"],
        "end_of_turn_added_p99_ms": end_added["p99"],
        "gateway_stages_ms": stages,
        "plans": result["plans"],
        "direct_turns_with_handle": result["reused"].get("direct", 0),
        "errors": result["errors"],
        "engines": "boomerang sim --time-scale 0 (no simulated compute: every millisecond is software)",
    }


CONTROL_PLANE = ("gateway", "router", "registry", "reaper")
CONTROL_PLANE_HOOK = ("gateway-hook", "router", "registry", "reaper")
HOOKED_ENGINES = ("sim-prefill-hook", "sim-decode-hook")


async def sequential_cpu(b: Bench, names: tuple[str, ...], base: dict[str, Any], path: str,
                          extra: tuple[str, ...] = ()) -> tuple[dict[str, float], dict[str, float], int, dict[str, Any]]:
    """Sequential conversations (one slot) on `path`: CPU ms per turn of `names` (and `extra`,
    reported apart), idle use taken out; the turns answered and the job's result."""
    idle_seconds = 2.0
    meter = (await b.cpu_meter(*names, *extra)).start()
    await asyncio.sleep(idle_seconds)
    idle = {k: v / idle_seconds for k, v in meter.stop().items()}
    job = {**base, "duration": b.cfg.gateway_seconds, "start_at": time.time() + 0.5, "slots": 1}
    running = asyncio.ensure_future(b.workers.run([job], timeout=b.cfg.gateway_seconds + 120))
    await asyncio.sleep(0.5)
    meter = (await b.cpu_meter(*names, *extra)).start()
    started = time.perf_counter()
    (sequential,) = await running
    cpu = meter.stop()
    seconds = time.perf_counter() - started
    turns = int(sequential["turns"].get(path, 0))
    per_turn = {k: round(1000 * max(0.0, v - idle.get(k, 0.0) * seconds) / max(turns, 1), 3)
                for k, v in cpu.items() if k != "clients"}
    return per_turn, {k: round(1000 * v, 2) for k, v in idle.items()}, turns, sequential


async def control_plane_hook(b: Bench) -> dict[str, Any]:
    """The whole control plane per turn in hook mode, on the engines `gateway_overhead`
    started: sequential conversations through the `--engine-hook` gateway; the CPU of that
    gateway, the router, registry, reaper and this database's Postgres backends (idle use
    taken out) per turn answered. The hooked engines' own CPU (simulator and hook together:
    the hook's PlanTurn, chain building and registration sender run inside the engine, as in
    vLLM) is reported beside it, not in the total."""
    task = b.progress.add_task(f"control plane, hook mode: CPU per turn, sequential, {b.cfg.gateway_seconds:g}s",
                               total=None)
    hook = f"http://{b.services.children['gateway-hook'].address}"
    base = {"kind": "turns", "gateway": "", "naive": "", "prefill": "", "decode": "", "model": SIM_MODEL,
            "hook": hook, "hook_model": HOOK_MODEL, "paths": ["hook"], "turns_per_conversation": 6, "words": 40,
            "max_tokens": 16, "think_seconds": 0.02}
    per_turn, idle, turns, sequential = await sequential_cpu(b, CONTROL_PLANE_HOOK, base, "hook", HOOKED_ENGINES)
    # For scale: the naive proxy's CPU per turn over the same engines (what routing a turn's
    # two requests in Python costs with no control plane at all).
    naive_base = {**base, "naive_hook": f"http://{b.services.children['naive-proxy-hook'].address}",
                  "prefill_hook": "", "decode_hook": "", "paths": ["naive-hook"]}
    naive_cpu, _, _, _ = await sequential_cpu(b, ("naive-proxy-hook",), naive_base, "naive-hook")
    b.progress.remove_task(task)
    async with httpx.AsyncClient(timeout=5.0) as http:  # what the prefill engine's hook planned, the whole phase
        stats = (await http.get(f"http://{b.services.children['sim-prefill-hook'].address}/sim/stats")).json()
    hook_stats = stats.get("hook", {})
    engines = {k: per_turn.pop(k) for k in HOOKED_ENGINES if k in per_turn}
    return {
        "cpu_ms_per_turn": per_turn,
        "cpu_ms_per_turn_total": round(sum(per_turn.values()), 3),
        "engines_cpu_ms_per_turn": engines,
        "naive_proxy_cpu_ms_per_turn": naive_cpu.get("naive-proxy-hook"),
        "turns": turns,
        "idle_cpu_ms_per_s": idle,
        "sequential_plans": sequential.get("hook_plans", {}),
        "engine_plans": {k.removeprefix("plan_"): v for k, v in hook_stats.items()
                         if k.startswith("plan_") and not k.startswith("plan_ms") and isinstance(v, int)},
        "engine_plan_ms_p50": hook_stats.get("plan_ms_p50"),
        "engine_pulls": stats.get("pulls"),
        "sequential_errors": sequential["errors"],
        "mode": "hook mode (the engines run the vLLM hook, plan and register; the gateway only routes)",
    }


async def control_plane(b: Bench, agents: int = 64) -> dict[str, Any]:
    """Boomerang's whole control plane end to end through the gateway (gateway-only mode),
    on the engines `gateway_overhead` started (`--time-scale 0`: no simulated compute).

    CPU per turn: sequential multi-turn conversations through the gateway, the CPU of the
    gateway, router, registry, reaper and this database's Postgres backends over the run,
    their idle use taken out, divided by the turns answered (first turns included). Then
    `agents` conversations at once: the share of later turns the gateway served as PULL, and
    the turns that failed.
    """
    cfg = b.cfg
    task = b.progress.add_task(f"control plane: CPU per turn, sequential, {cfg.gateway_seconds:g}s", total=None)
    gateway = b.gateway_url
    base = {"kind": "turns", "gateway": gateway, "naive": "", "prefill": "", "decode": "", "model": SIM_MODEL,
            "paths": ["boomerang"], "turns_per_conversation": 6, "words": 40, "max_tokens": 16,
            "think_seconds": 0.02}
    per_turn, idle, turns, sequential = await sequential_cpu(b, CONTROL_PLANE, base, "boomerang")
    b.progress.update(task, description=f"control plane: {agents} agents at once, {cfg.gateway_seconds:g}s")
    job = {**base, "duration": cfg.gateway_seconds, "start_at": time.time() + 0.5, "slots": agents}
    metrics = {"gateway": f"{gateway}/metrics", "router": f"http://{b.services.children['router'].metrics_address}/metrics"}
    async with httpx.AsyncClient(timeout=10.0) as http:
        before = await _counters(http, metrics)
        running = asyncio.ensure_future(b.workers.run([job], timeout=cfg.gateway_seconds + 120))
        sampler = b.sampler("agents", CONTROL_PLANE, cfg.gateway_seconds)
        (crowd,) = await running
        await b.collect("agents", sampler)
        after = await _counters(http, metrics)
    degraded = {k: int(v - before.get(k, 0.0)) for k, v in sorted(after.items()) if v > before.get(k, 0.0)}
    b.progress.remove_task(task)
    b.sample_memory()
    later = sum(crowd["plans"].values())
    failed = sum(crowd["errors"].values())
    return {
        "cpu_ms_per_turn": per_turn,
        "cpu_ms_per_turn_total": round(sum(per_turn.values()), 3),
        "turns": turns,
        "idle_cpu_ms_per_s": idle,
        "sequential_plans": sequential["plans"],
        "sequential_errors": sequential["errors"],
        "agents": agents,
        "agents_turns": int(crowd["turns"].get("boomerang", 0)),
        "agents_later_turns": later,
        "agents_plans": crowd["plans"],
        "agents_pull_share": round(crowd["plans"].get("PULL", 0) / later, 4) if later else None,
        "agents_failed": failed,
        "agents_errors": crowd["errors"],
        "agents_degraded_by": degraded,
        "agents_turns_per_s": round(int(crowd["turns"].get("boomerang", 0)) / max(cfg.gateway_seconds, 1e-3), 1),
        "mode": "gateway-only (the engines have no hook; the gateway plans and reports each turn)",
    }
