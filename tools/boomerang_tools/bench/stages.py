"""A pulled turn, stage by stage: Boomerang's own time and CPU on a turn that pulls 2k and 24k
tokens of history, through the gateway and with the engine hook.

On an H200 a pulled turn of Qwen3-32B takes 76 ms at 2k tokens and 187 ms at 24k
(docs/performance.md), so Boomerang's milliseconds are measured where they are spent:

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

from boomerang_tools.bench.context import SIM_MODEL, Bench
from boomerang_tools.bench.overhead import (
    CONTROL_PLANE,
    CONTROL_PLANE_HOOK,
    HOOK_MODEL,
    HOOKED_ENGINES,
    sequential_cpu,
)
from boomerang_tools.bench.stats import floats, summarize
from boomerang_tools.bench.turns import user_message
from boomerang_tools.demo.client import stream_chat

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
        text = (await http.get(f"http://{b.services.children[service].metrics_address}/metrics")).text
        total = count = 0.0
        for family in text_string_to_metric_families(text):
            if family.name == name:
                for sample in family.samples:
                    if sample.name == f"{name}_sum":
                        total += sample.value
                    elif sample.name == f"{name}_count":
                        count += sample.value
        out[key] = (total, count)
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
    children = b.services.children
    base: dict[str, Any] = {"kind": "turns", "gateway": b.gateway_url, "naive": "",
                            "prefill": "", "decode": "", "model": SIM_MODEL, "turns_per_conversation": 4,
                            "words": TURN_WORDS, "system_words": int(context / TOKENS_PER_WORD), "max_tokens": 16, "think_seconds": 0.02}
    path = "hook" if hook else "boomerang"
    base["paths"] = [path]
    if hook:
        base |= {"hook": f"http://{children['gateway-hook'].address}", "hook_model": HOOK_MODEL}
    async with httpx.AsyncClient(timeout=10.0) as http:
        before = await _histograms(http, b)
        per_turn, _, turns, result = await sequential_cpu(
            b, CONTROL_PLANE_HOOK if hook else CONTROL_PLANE, base, path, HOOKED_ENGINES if hook else ())
        inside = _mean_ms(before, await _histograms(http, b))
        engine: dict[str, Any] = {}
        if hook:
            stats = (await http.get(f"http://{children['sim-prefill-hook'].address}/sim/stats")).json()
            engine = stats.get("hook", {})
    engines_cpu = {k: per_turn.pop(k) for k in HOOKED_ENGINES if k in per_turn}
    times = summarize(floats(result["times_ms"][path]))
    out: dict[str, Any] = {
        "turns": turns,
        "later_turn_ms": {"p50": times["p50_ms"], "p99": times["p99_ms"]},
        "plans": result["hook_plans"] if hook else result["plans"],
        "errors": result["errors"],
        **inside,
        "cpu_ms_per_turn": per_turn,
        "cpu_ms_per_turn_total": round(sum(per_turn.values()), 3),
    }
    if hook:
        recent = engine.get("plan_ms_recent") or []
        later = sorted(recent[-max(1, turns):])
        out["engine_plan_ms_p50"] = round(later[len(later) // 2], 3) if later else None
        out["engines_cpu_ms_per_turn"] = engines_cpu
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
    hook = f"http://{b.services.children['gateway-hook'].address}"
    paths = {"gateway": (b.gateway_url, SIM_MODEL), "hook": (hook, HOOK_MODEL)}
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
