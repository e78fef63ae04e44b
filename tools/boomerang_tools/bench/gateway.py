"""The `gateway` phase: turns through the gateway and through vLLM's example proxy rebuilt
(naive_proxy.py) side by side over the same engines, and hook mode beside them: a gateway with
`--engine-hook` in front of engines that run the vLLM hook (`sim --hook`), which plan with the
router and register with the registry themselves. Then the whole control plane's CPU per turn,
a pulled turn stage by stage, and a first turn with nothing to pull.

A pulled turn, stage by stage: Boomerang's own time and CPU on a turn that pulls 2k and 24k
tokens of history, through the gateway and with the engine hook. On an H200 a pulled turn of
Qwen3-32B takes 76 ms at 2k tokens and 187 ms at 24k (docs/performance.md), so Boomerang's
milliseconds are measured where they are spent:

* the gateway's stages before the prefill, from each turn's `Server-Timing` (tokenize, plan;
  a streamed turn's headers leave before its end, so the end-of-turn wait is the gateway
  phase's own figure), and the hook's own PlanTurn wait inside the engine;
* inside the router, the plan (`boomerang_router_plan_seconds`: chain, claim, decision and
  the audit row's commit), and inside the registry, the claim
  (`boomerang_registry_claim_seconds`), as the mean over the run from their histograms;
* the token chain of the prompt, built here with the same function the router runs;
* the CPU of every control-plane process per turn (`sequential_cpu`: idle use taken out),
  Postgres backends included, and the hooked engines' apart.

Each context runs sequential conversations (one at a time) that start at that many tokens
of history and add about 125 a turn, on the engines `gateway_overhead` started
(`--time-scale 0`: no simulated compute, every millisecond is software).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from typing import Any

import httpx
from boomerang.tokenchain import build_chain
from prometheus_client.parser import text_string_to_metric_families

from boomerang_tools.bench.context import GATEWAY_ENV, SIM_MODEL, Bench
from boomerang_tools.bench.loadgen import PATHS, user_message
from boomerang_tools.bench.report import floats, summarize
from boomerang_tools.demo.client import stream_chat
from boomerang_tools.stack.stack import wait_engines

# The hooked engines serve the same profile under a name of their own, so each gateway's
# turns reach only its own pair of engines.
HOOK_MODEL = "bench-hook/Qwen3-32B"


# The `turns` job (loadgen.py) each step sends, less its paths and their URLs.
TURNS_JOB = {"kind": "turns", "model": SIM_MODEL, "hook_model": HOOK_MODEL,
             "turns_per_conversation": 6, "words": 40, "max_tokens": 16, "think_seconds": 0.02}


def _url(b: Bench, name: str) -> str:
    return f"http://{b.services.children[name].address}"


async def _engine_stats(http: httpx.AsyncClient, b: Bench) -> dict[str, Any]:
    """The hooked prefill engine's /sim/stats: what its hook planned, the whole phase."""
    stats: dict[str, Any] = (await http.get(_url(b, "sim-prefill-hook") + "/sim/stats")).json()
    return stats


# Why turns of the agents phase went without reuse, from the services' own counters.
DEGRADE_COUNTERS = {
    "gateway": ("boomerang_gateway_fallbacks", "cause"),  # the gateway did not get a plan
    "router": ("boomerang_router_claims_unanswered", "why"),  # the router planned without the claim
}


async def _samples(http: httpx.AsyncClient, url: str, name: str) -> list[Any]:
    """The samples of the metric family `name` on the /metrics page at `url`."""
    families = text_string_to_metric_families((await http.get(url)).text)
    return [sample for family in families if family.name == name for sample in family.samples]


async def _counters(http: httpx.AsyncClient, urls: dict[str, str]) -> dict[str, float]:
    """DEGRADE_COUNTERS as `service:label` → value, read from each service's /metrics."""
    out: dict[str, float] = {}
    for service, url in urls.items():
        name, label = DEGRADE_COUNTERS[service]
        for sample in await _samples(http, url, name):
            if sample.name.endswith("_total"):
                out[f"{service}:{sample.labels[label]}"] = sample.value
    return out


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
    if not cfg.control_plane:  # else the gateway runs in the control plane's process (runner.py)
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
    await wait_engines(b.router_address, 2, gateway, model=SIM_MODEL)
    await wait_engines(b.router_address, 2, hook, model=HOOK_MODEL)
    b.progress.update(task, description=f"gateway overhead: turns on 6 paths for {cfg.gateway_seconds:g}s")
    job = {**TURNS_JOB, "gateway": gateway, "naive": naive, "prefill": prefill, "decode": decode,
           "hook": hook, "naive_hook": naive_hook, "prefill_hook": prefill_hook,
           "decode_hook": decode_hook, "duration": cfg.gateway_seconds,
           "start_at": time.time() + 0.5, "slots": cfg.gateway_slots}
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
    # A turn's end: finishing chunk to the end of the stream. The gateway holds `[DONE]`
    # until ReportTurn is answered; what that adds is its end less the direct path's.
    ends = {p: summarize(floats(result.get("ends_ms", {}).get(p, b""))) for p in PATHS}
    end_added = {q: round(ends["boomerang"][f"{q}_ms"] - ends["direct"][f"{q}_ms"], 3)
                 if ends["boomerang"]["count"] and ends["direct"]["count"] else None for q in ("p50", "p99")}
    # What a path adds: its turn time less the direct path's over the same engines; ratio:
    # Boomerang's added time over the naive proxy's (`boomerang_p50_ms`, `naive_p50_ms`,
    # `ratio`, …). Hook mode against its own pair of engines' direct path and naive proxy (no
    # conversation id there: the hook does nothing): all that Boomerang adds, the engines' own
    # PlanTurn and registration included (`hook_p50_ms`, `naive_hook_p50_ms`, `hook_ratio`, …).
    out: dict[str, Any] = {}
    for path, pre, pair in (("boomerang", "", ""), ("hook", "hook_", "-hook")):
        for q, suffix in (("p50", ""), ("p99", "_p99")):
            direct = paths["direct" + pair][f"{q}_ms"]
            mine = round(paths[path][f"{q}_ms"] - direct, 3)
            theirs = round(paths["naive" + pair][f"{q}_ms"] - direct, 3)
            out |= {f"{path}_{q}_ms": mine, f"naive_{pre}{q}_ms": theirs,
                    f"{pre}ratio{suffix}": _ratio(mine, theirs)}
    return out | {
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
SEQUENTIAL_CPU = {"boomerang": CONTROL_PLANE, "hook": CONTROL_PLANE_HOOK + HOOKED_ENGINES,
                  "naive-hook": ("naive-proxy-hook",)}


async def sequential_cpu(
    b: Bench, path: str, job: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Sequential conversations (one slot) of `job` on `path`: the CPU ms per turn answered of
    the processes that serve it (SEQUENTIAL_CPU) and this database's Postgres backends, idle
    use taken out, with the turns answered and the idle use; the hooked engines' apart (not in
    the total). The figures and the job's result."""
    names = SEQUENTIAL_CPU[path]
    idle_seconds = 2.0
    meter = (await b.cpu_meter(*names)).start()
    await asyncio.sleep(idle_seconds)
    idle = {k: v / idle_seconds for k, v in meter.stop().items()}
    job = {**job, "paths": [path], "duration": b.cfg.gateway_seconds, "slots": 1,
           "start_at": time.time() + 0.5}
    running = asyncio.ensure_future(b.workers.run([job], timeout=b.cfg.gateway_seconds + 120))
    await asyncio.sleep(0.5)
    meter = (await b.cpu_meter(*names)).start()
    started = time.perf_counter()
    (sequential,) = await running
    cpu = meter.stop()
    seconds = time.perf_counter() - started
    turns = int(sequential["turns"].get(path, 0))
    per_turn = {k: round(1000 * max(0.0, v - idle.get(k, 0.0) * seconds) / max(turns, 1), 3)
                for k, v in cpu.items() if k != "clients"}
    engines = {k: per_turn.pop(k) for k in HOOKED_ENGINES if k in per_turn}
    figures = {"cpu_ms_per_turn": per_turn, "turns": turns,
               "cpu_ms_per_turn_total": round(sum(per_turn.values()), 3),
               "idle_cpu_ms_per_s": {k: round(1000 * v, 2) for k, v in idle.items()}}
    return figures | ({"engines_cpu_ms_per_turn": engines} if engines else {}), sequential


async def control_plane_hook(b: Bench) -> dict[str, Any]:
    """The whole control plane per turn in hook mode, on the engines `gateway_overhead`
    started: sequential conversations through the `--engine-hook` gateway; the CPU of that
    gateway, the router, registry, reaper and this database's Postgres backends (idle use
    taken out) per turn answered. The hooked engines' own CPU (simulator and hook together:
    the hook's PlanTurn, chain building and registration sender run inside the engine, as in
    vLLM) is reported beside it, not in the total."""
    task = b.progress.add_task(f"control plane, hook mode: CPU per turn, sequential, {b.cfg.gateway_seconds:g}s",
                               total=None)
    hook = {**TURNS_JOB, "hook": _url(b, "gateway-hook")}
    figures, sequential = await sequential_cpu(b, "hook", hook)
    # For scale: the naive proxy's CPU per turn over the same engines (what routing a turn's
    # two requests in Python costs with no control plane at all).
    naive_hook = {**TURNS_JOB, "naive_hook": _url(b, "naive-proxy-hook")}
    naive, _ = await sequential_cpu(b, "naive-hook", naive_hook)
    b.progress.remove_task(task)
    async with httpx.AsyncClient(timeout=5.0) as http:
        stats = await _engine_stats(http, b)
    hook_stats = stats.get("hook", {})
    return figures | {
        "engines_cpu_ms_per_turn": figures.get("engines_cpu_ms_per_turn", {}),
        "naive_proxy_cpu_ms_per_turn": naive["cpu_ms_per_turn"].get("naive-proxy-hook"),
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
    figures, sequential = await sequential_cpu(b, "boomerang", {**TURNS_JOB, "gateway": gateway})
    b.progress.update(task, description=f"control plane: {agents} agents at once, {cfg.gateway_seconds:g}s")
    job = {**TURNS_JOB, "gateway": gateway, "paths": ["boomerang"], "duration": cfg.gateway_seconds,
           "start_at": time.time() + 0.5, "slots": agents}
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
    return figures | {
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


CONTEXTS = (2_000, 24_000)
# The simulator's tokenizer makes about 1.96 tokens of a bench word (24,000 words: 46,986 tokens).
TOKENS_PER_WORD = 1.96
TURN_WORDS = 64  # about 125 tokens a turn
HISTOGRAMS = {"router_plan": ("router", "boomerang_router_plan_seconds"),
              "registry_claim": ("registry", "boomerang_registry_claim_seconds")}


async def _histograms(http: httpx.AsyncClient, b: Bench) -> dict[str, tuple[float, float]]:
    """(sum, count) of each of HISTOGRAMS, from its service's /metrics."""
    out: dict[str, tuple[float, float]] = {}
    for key, (service, name) in HISTOGRAMS.items():
        url = f"http://{b.services.children[service].metrics_address}/metrics"
        samples = await _samples(http, url, name)
        out[key] = (sum(x.value for x in samples if x.name == f"{name}_sum"),
                    sum(x.value for x in samples if x.name == f"{name}_count"))
    return out


def _mean_ms(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key, (total, count) in after.items():
        n = count - before[key][1]
        out[f"{key}_mean_ms"] = round(1000 * (total - before[key][0]) / n, 3) if n > 0 else None
    return out


def chain_ms(tokens: int, block_size: int = 16, repeat: int = 20) -> float:
    """Milliseconds to build the token chain of a `tokens`-token prompt (median of `repeat`)."""
    ids = [random.Random(tokens).randrange(1, 150_000) for _ in range(tokens)]
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        build_chain(ids, block_size, "")
        times.append(time.perf_counter() - t)
    return round(1000 * sorted(times)[len(times) // 2], 3)


async def _one(b: Bench, context: int, hook: bool) -> dict[str, Any]:
    """Sequential conversations of `context` tokens of history on one path."""
    path = "hook" if hook else "boomerang"
    job = {**TURNS_JOB, "gateway": b.gateway_url, "hook": _url(b, "gateway-hook") if hook else "",
           "turns_per_conversation": 4, "words": TURN_WORDS,
           "system_words": int(context / TOKENS_PER_WORD)}
    async with httpx.AsyncClient(timeout=10.0) as http:
        before = await _histograms(http, b)
        figures, result = await sequential_cpu(b, path, job)
        inside = _mean_ms(before, await _histograms(http, b))
        engine = (await _engine_stats(http, b)).get("hook", {}) if hook else {}
    figures.pop("idle_cpu_ms_per_s")
    times = summarize(floats(result["times_ms"][path]))
    out: dict[str, Any] = figures | inside | {
        "later_turn_ms": {"p50": times["p50_ms"], "p99": times["p99_ms"]},
        "plans": result["hook_plans"] if hook else result["plans"],
        "errors": result["errors"],
    }
    if hook:
        recent = engine.get("plan_ms_recent") or []
        later = sorted(recent[-max(1, figures["turns"]):])
        out["engine_plan_ms_p50"] = round(later[len(later) // 2], 3) if later else None
    else:
        out["stages_ms"] = {k: summarize(floats(v))["p50_ms"] for k, v in result["stages_ms"].items()}
    return out


async def pulled_turn_stages(b: Bench) -> dict[str, Any]:
    """Both paths at each of CONTEXTS; the chain's cost beside them."""
    task = b.progress.add_task("a pulled turn, stage by stage (2k and 24k tokens)", total=None)
    out: dict[str, Any] = {"contexts": {}, "chain_ms": {str(c): chain_ms(c) for c in CONTEXTS}}
    for context in CONTEXTS:
        out["contexts"][str(context)] = {"gateway": await _one(b, context, hook=False),
                                         "hook": await _one(b, context, hook=True)}
    b.progress.remove_task(task)
    return out


FIRST_TURNS = 20  # pairs (reuse on and off, in turn first) per context, path and id


async def first_turns(b: Bench) -> dict[str, Any]:
    """A first turn has nothing to pull: its TTFT with Boomerang on against off (the same
    gateway, `X-Boomerang-Reuse: off`), through the gateway and with the hook, with a
    conversation id and without, at each of CONTEXTS. Each pair runs one request at a time,
    on first or off first in turn, on the `--time-scale 0` engines: the difference is
    Boomerang's own time."""
    task = b.progress.add_task("a first turn with nothing to pull (on against off)", total=None)
    paths = {"gateway": (b.gateway_url, SIM_MODEL), "hook": (_url(b, "gateway-hook"), HOOK_MODEL)}
    rng = random.Random(31)
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=30.0) as http:
        for context in CONTEXTS:
            system = user_message(rng, int(context / TOKENS_PER_WORD))
            for name, (base, model) in paths.items():
                for with_id in (True, False):
                    on, off = list[float](), list[float]()
                    for i in range(FIRST_TURNS):
                        for reuse, into in (("on", on), ("off", off))[::1 if i % 2 else -1]:
                            await asyncio.sleep(0.05)  # the last turn's report and plan beside it are done
                            messages = [{"role": "system", "content": system},
                                        {"role": "user", "content": user_message(rng, TURN_WORDS)}]
                            body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": 2}
                            if with_id:
                                body["conversation_id"] = f"first-{uuid.uuid4().hex}"
                            turn = await stream_chat(http, base, body, {"X-Boomerang-Reuse": reuse})
                            if not turn.ok:
                                raise RuntimeError(f"a first turn through {base} failed: {turn.error}")
                            into.append(turn.ttft_ms)
                    deltas = sorted(a - o for a, o in zip(on, off, strict=True))
                    out[f"{context}/{name}/{'id' if with_id else 'no id'}"] = {
                        "on_p50_ms": summarize(on)["p50_ms"], "off_p50_ms": summarize(off)["p50_ms"],
                        "delta_p50_ms": round(deltas[len(deltas) // 2], 3)}
    b.progress.remove_task(task)
    return out
