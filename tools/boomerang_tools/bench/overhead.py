"""Gateway overhead: the gateway and the naive proxy side by side over the same engines."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
from boomerang.clients.router import RouterClient
from boomerang.v1 import router_service_pb2 as rtpb

from boomerang_tools.bench.context import Bench
from boomerang_tools.bench.stats import floats, summarize
from boomerang_tools.bench.turns import PATHS

SIM_MODEL = "Qwen/Qwen3-32B"


async def _wait_engines(gateway: str, router: str, timeout: float = 30.0) -> None:
    """Until the router's pool and the gateway both see the simulated engines."""
    deadline = time.monotonic() + timeout
    async with RouterClient(router, timeout=2.0) as client, httpx.AsyncClient(timeout=2.0) as http:
        while time.monotonic() < deadline:
            try:
                listed = await client.list_engines(rtpb.RouterServiceListEnginesRequest(model=SIM_MODEL))
                health = (await http.get(gateway + "/health")).json()
                if sum(1 for e in listed.engines if e.available) >= 2 and int(health.get("models", 0)) >= 1:
                    return
            except Exception:  # noqa: BLE001 - not yet
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError("the router and gateway did not see the simulated engines in time")


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b > 0 else None


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
    s.start("gateway", ["gateway", "--listen", "127.0.0.1:0", "--router", b.router_address, "--registry",
                        b.registry_address, "--allow-anonymous"])
    s.start("naive-proxy", ["bench", "--serve-naive-proxy", "127.0.0.1:0", "--prefill", prefill, "--decode", decode])
    gateway, naive = (f"http://{a}" for a in await s.ready("gateway", "naive-proxy"))
    await _wait_engines(gateway, b.router_address)
    b.progress.update(task, description=f"gateway overhead: turns on 3 paths for {cfg.gateway_seconds:g}s")
    job = {"kind": "turns", "gateway": gateway, "naive": naive, "prefill": prefill, "decode": decode,
           "model": SIM_MODEL, "duration": cfg.gateway_seconds, "start_at": time.time() + 0.5,
           "slots": cfg.gateway_slots, "turns_per_conversation": 6, "words": 40, "max_tokens": 16,
           "think_seconds": 0.02}
    running = asyncio.ensure_future(b.workers.run([job], timeout=cfg.gateway_seconds + 120))
    await asyncio.sleep(0.5)
    sampler = b.sampler("turns", ("gateway", "naive-proxy", "router", "registry"), cfg.gateway_seconds)
    (result,) = await running
    await b.collect("turns", sampler)
    b.progress.remove_task(task)
    b.sample_memory()
    paths = {p: summarize(floats(result["times_ms"][p])) for p in PATHS}
    stages = {k: summarize(floats(v)) for k, v in result["stages_ms"].items()}
    direct = paths["direct"]
    add = {p: {q: round(paths[p][f"{q}_ms"] - direct[f"{q}_ms"], 3) for q in ("p50", "p99")} for p in ("naive", "boomerang")}
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
    task = b.progress.add_task("control plane: idle CPU", total=None)
    gateway = f"http://{b.services.children['gateway'].address}"
    idle_seconds = 2.0
    meter = (await b.cpu_meter(*CONTROL_PLANE)).start()
    await asyncio.sleep(idle_seconds)
    idle = {k: v / idle_seconds for k, v in meter.stop().items()}
    base = {"kind": "turns", "gateway": gateway, "naive": "", "prefill": "", "decode": "", "model": SIM_MODEL,
            "paths": ["boomerang"], "turns_per_conversation": 6, "words": 40, "max_tokens": 16,
            "think_seconds": 0.02}
    b.progress.update(task, description=f"control plane: CPU per turn, sequential, {cfg.gateway_seconds:g}s")
    job = {**base, "duration": cfg.gateway_seconds, "start_at": time.time() + 0.5, "slots": 1}
    running = asyncio.ensure_future(b.workers.run([job], timeout=cfg.gateway_seconds + 120))
    await asyncio.sleep(0.5)
    meter = (await b.cpu_meter(*CONTROL_PLANE)).start()
    started = time.perf_counter()
    (sequential,) = await running
    cpu = meter.stop()
    seconds = time.perf_counter() - started
    turns = int(sequential["turns"].get("boomerang", 0))
    per_turn = {k: round(1000 * max(0.0, v - idle.get(k, 0.0) * seconds) / max(turns, 1), 3)
                for k, v in cpu.items() if k != "clients"}
    b.progress.update(task, description=f"control plane: {agents} agents at once, {cfg.gateway_seconds:g}s")
    job = {**base, "duration": cfg.gateway_seconds, "start_at": time.time() + 0.5, "slots": agents}
    running = asyncio.ensure_future(b.workers.run([job], timeout=cfg.gateway_seconds + 120))
    sampler = b.sampler("agents", CONTROL_PLANE, cfg.gateway_seconds)
    (crowd,) = await running
    await b.collect("agents", sampler)
    b.progress.remove_task(task)
    b.sample_memory()
    later = sum(crowd["plans"].values())
    failed = sum(crowd["errors"].values())
    return {
        "cpu_ms_per_turn": per_turn,
        "cpu_ms_per_turn_total": round(sum(per_turn.values()), 3),
        "turns": turns,
        "idle_cpu_ms_per_s": {k: round(1000 * v, 2) for k, v in idle.items()},
        "sequential_plans": sequential["plans"],
        "sequential_errors": sequential["errors"],
        "agents": agents,
        "agents_turns": int(crowd["turns"].get("boomerang", 0)),
        "agents_later_turns": later,
        "agents_plans": crowd["plans"],
        "agents_pull_share": round(crowd["plans"].get("PULL", 0) / later, 4) if later else None,
        "agents_failed": failed,
        "agents_errors": crowd["errors"],
        "agents_turns_per_s": round(int(crowd["turns"].get("boomerang", 0)) / max(cfg.gateway_seconds, 1e-3), 1),
        "mode": "gateway-only (the engines have no hook; the gateway plans and reports each turn)",
    }
