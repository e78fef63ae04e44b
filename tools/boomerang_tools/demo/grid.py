"""`boomerang demo --grid`: the router's plan by predicted time to first token, against the oracle.

For each point of a grid (the two H200 profiles; contexts 2k, 8k, 24k; links of 400, 55, 3
and 1 GB/s from D to P; with and without a shared system prompt in P's prefix cache) it
measures, on the same simulated engines:

- the planner: a conversation's second turn through the gateway (with
  `BOOMERANG_PREFILL_ON_DECODE`), its plan and its time to first token;
- each option separately, sent to the engines directly as the gateway would send it
  (recompute on P, pull D's retained blocks to P, prefill on D); the fastest is the oracle.
  The prefill on D runs beside a decode stream on D, and D's `/sim/stats` give the pause it
  added to that stream (D's added inter-token latency).

A point passes when the option the planner chose, as measured with the others, is within 5%
of the oracle and no more than 2% above recompute. The planner's end-to-end TTFT (through the
gateway: tokenize, plan, report) is printed beside it, with its own ratio to the oracle.

P's prefix cache holds `P_CACHE_BLOCKS` blocks, about the shared system prompt: the cache is
filled from a prompt's start, so a conversation's own history would hit it too; "no shared
prompt" conversations start with their own nonce and P's cache is flushed with an unrelated
prompt before each measured turn. The link is set on P (`POST /sim/link`) and the links run
from fastest to slowest per model; a warm-up conversation of each length lets the router learn
each link
before its points (it learns from reported times, so the first pull over a slower link is slow).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from boomerang_tools.demo.client import TurnResult, stream_chat
from boomerang_tools.demo.modes import GATEWAY, stack_config
from boomerang_tools.sim.costmodel import PROFILES
from boomerang_tools.stack.stack import SimSpec, Stack

MODELS = ("qwen3-32b-h200", "qwen3-8b-h200")
CONTEXTS = (2000, 8000, 24000)
LINKS_GBPS = (400.0, 55.0, 3.0, 1.0)  # fastest first: the router learns each slower link by pulling over it
P_CACHE_BLOCKS = 64  # 1,024 tokens: about the shared system prompt
D_CACHE_BLOCKS = 200_000  # D's prefix cache holds every history (a prefill on D computes only the new turn)
SYSTEM_TOKENS = 1000  # the system prompt: P's cache holds it when it is shared
NEW_TOKENS = 200  # the new turn's user message
OPTIONS = ("recompute", "pull", "prefill_on_decode")
DECISION_OPTION = {"RECOMPUTE": "recompute", "COLD": "recompute", "PULL": "pull",
                   "PREFILL_ON_DECODE": "prefill_on_decode"}
ORACLE_SHARE = 0.05  # the planner's option within 5% of the oracle
RECOMPUTE_SHARE = 0.02  # and never more than 2% above recompute


@dataclass
class Point:
    """One grid point's measurements (ms)."""

    model: str
    context: int
    link_gbps: float
    shared_prompt: bool
    decision: str  # the planner's plan header (PULL, RECOMPUTE, COLD, PREFILL_ON_DECODE)
    planner_ttft_ms: float  # through the gateway
    options_ms: dict[str, float] = field(default_factory=dict)  # each option, measured directly
    decode_pause_ms: float = 0.0  # the pause the prefill on D added to a decode running on D
    decode_itl_ms: float = 0.0  # D's median inter-token gap
    prompt_tokens: int = 0
    reason: str = ""  # the plan's reason header (why it did not reuse, when it did not)


def verdict(point: Point) -> dict[str, Any]:
    """The oracle, the planner's option as measured, and whether the targets hold."""
    oracle_option = min(point.options_ms, key=lambda k: point.options_ms[k])
    oracle = point.options_ms[oracle_option]
    option = DECISION_OPTION.get(point.decision, "")
    chosen = point.options_ms.get(option)
    recompute = point.options_ms["recompute"]
    on_p = min(point.options_ms.get("pull", recompute), recompute)  # the best that moves no work to D
    within = chosen is not None and chosen <= oracle * (1 + ORACLE_SHARE)
    below = chosen is not None and chosen <= recompute * (1 + RECOMPUTE_SHARE)
    return {"oracle": oracle_option, "oracle_ms": round(oracle, 1),
            "chosen": option or point.decision, "chosen_ms": round(chosen, 1) if chosen is not None else None,
            "chosen_over_oracle": round(chosen / oracle, 3) if chosen is not None else None,
            "planner_over_oracle": round(point.planner_ttft_ms / oracle, 3),
            "best_on_p_ms": round(on_p, 1),
            "chosen_over_best_on_p": round(chosen / on_p, 3) if chosen is not None else None,
            "within_oracle": within, "not_above_recompute": below, "ok": within and below}


def summary(points: list[Point]) -> dict[str, Any]:
    """The grid's totals: points, those within the oracle, those not above recompute."""
    verdicts = [verdict(p) for p in points]
    on_p = [v for v in verdicts if v["chosen"] in ("recompute", "pull")]
    return {"points": len(points), "within_oracle": sum(v["within_oracle"] for v in verdicts),
            "not_above_recompute": sum(v["not_above_recompute"] for v in verdicts),
            # Where the plan kept the turn on P (a prefill on D is bounded by D's inter-token
            # latency), was it the better of recompute and pull?
            "on_p": len(on_p), "on_p_within_best_on_p": sum(v["chosen_over_best_on_p"] <= 1 + ORACLE_SHARE for v in on_p),
            "ok": bool(points) and all(v["ok"] for v in verdicts)}


def table(points: list[Point], title: str) -> Table:
    """The grid as a rich table, one row per point."""
    t = Table(title=title)
    for name in ("model", "ctx", "link GB/s", "sys prompt", "planner", "TTFT", "recompute", "pull",
                 "prefill on D", "oracle", "chosen/oracle", "chosen/best on P", "D pause / ITL", "ok"):
        t.add_column(name, justify="left" if name in ("model", "planner", "oracle") else "right")
    for p in points:
        v = verdict(p)
        opts = p.options_ms
        t.add_row(p.model, f"{p.context // 1000}k", f"{p.link_gbps:g}", "shared" if p.shared_prompt else "none",
                  p.decision, f"{p.planner_ttft_ms:.0f}",
                  *(f"{opts[o]:.0f}" if o in opts else "-" for o in OPTIONS),
                  v["oracle"], *(f"{v[k]:.2f}" if v[k] is not None else "-"
                                 for k in ("chosen_over_oracle", "chosen_over_best_on_p")),
                  f"{p.decode_pause_ms:.0f} ms / {p.decode_itl_ms:.0f}", "yes" if v["ok"] else "NO")
    return t


def write_report(out: Path, points: list[Point], time_scale: float) -> None:
    """Add the grid to `demo-report.json` (kept beside what the replay wrote there)."""
    path = out / "demo-report.json"
    report: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    report["grid"] = {"time_scale": time_scale, "summary": summary(points),
                      "points": [{**asdict(p), **verdict(p)} for p in points]}
    path.write_text(json.dumps(report, indent=2) + "\n")


class _Words:
    """Text of roughly a given number of tokens, unique per seed."""

    def __init__(self, seed: str):
        self.rng = random.Random(seed)

    def text(self, words: int) -> str:
        return " ".join(f"{self.rng.choice(('file', 'test', 'line', 'call', 'value', 'error'))}{self.rng.randrange(10_000)}"
                        for _ in range(words))


async def _stream(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> TurnResult:
    """A streamed chat request, timed (RuntimeError when it fails)."""
    result = await stream_chat(http, url, body)
    if not result.ok:
        raise RuntimeError(f"{url}: HTTP {result.status}: {result.error[:300]}")
    return result


class _Grid:
    def __init__(self, http: httpx.AsyncClient, stack: Stack, model: str, index: int):
        self.http, self.stack = http, stack
        self.model = PROFILES[model].served_model_name
        self.profile = model
        self.p, self.d = stack.prefill_urls[index], stack.decode_urls[index]
        self.system = ""
        self.words_per_token = 1.0

    async def calibrate(self) -> None:
        """The words a token takes in this model's tokenizer, so each context is what it says."""
        resp = await self.http.post(self.p + "/tokenize", json={"model": self.model, "prompt": _Words("c").text(1000)})
        self.words_per_token = 1000 / resp.json()["count"]
        self.system = _Words("system").text(self.words(SYSTEM_TOKENS))

    def words(self, tokens: int) -> int:
        return max(int(tokens * self.words_per_token), 10)

    def messages(self, context: int, shared: bool, seed: str) -> list[dict[str, str]]:
        """A first turn of `context − NEW_TOKENS` tokens: the system prompt and a user message."""
        words = _Words(seed)
        system = self.system if shared else f"{seed} {words.text(self.words(SYSTEM_TOKENS))}"
        user = words.text(self.words(context - SYSTEM_TOKENS - NEW_TOKENS))
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def next_turn(self, history: list[dict[str, str]], reply: str, seed: str) -> list[dict[str, str]]:
        return [*history, {"role": "assistant", "content": reply},
                {"role": "user", "content": _Words(seed + "n").text(self.words(NEW_TOKENS))}]

    async def flush_p(self) -> None:
        """Evict P's prefix cache with an unrelated prompt (P then holds no conversation's start)."""
        flush = _Words(uuid.uuid4().hex).text(self.words(SYSTEM_TOKENS + NEW_TOKENS))
        body = {"model": self.model, "max_tokens": 1, "messages": [{"role": "user", "content": flush}]}
        (await self.http.post(self.p + "/v1/chat/completions", json=body)).raise_for_status()

    async def gateway_turn(self, messages: list[dict[str, str]], conv: str, max_tokens: int) -> tuple[float, str, str]:
        """A turn through the gateway: (ms to the first content, text, "plan" or "plan/reason")."""
        result = await _stream(self.http, self.stack.gateway_url, {
            "model": self.model, "messages": messages, "max_tokens": max_tokens,
            "conversation_id": conv})
        decision = result.plan + (f"/{result.reason}" if result.reason else "")
        return result.ttft_ms, result.text, decision

    async def planner(self, context: int, shared: bool) -> tuple[str, float]:
        """A conversation's second turn through the gateway: ("plan" or "plan/reason", TTFT ms)."""
        conv, seed = f"grid-{uuid.uuid4().hex}", uuid.uuid4().hex
        history = self.messages(context, shared, seed)
        _, reply, _ = await self.gateway_turn(history, conv, 16)
        if not shared:
            await self.flush_p()
        await asyncio.sleep(0.2)  # the first turn's report lands before the next plan
        ttft, _, decision = await self.gateway_turn(self.next_turn(history, reply, seed), conv, 2)
        await asyncio.sleep(0.2)
        return decision, ttft

    async def _stats(self, url: str) -> dict[str, Any]:
        return dict((await self.http.get(url + "/sim/stats")).json())

    async def options(self, context: int, shared: bool) -> tuple[dict[str, float], float, float, int]:
        """Each option on one history: prefill on D (beside a decode on D), recompute, pull."""
        seed = uuid.uuid4().hex
        history = self.messages(context, shared, seed)
        resp = await self.http.post(self.p + "/v1/chat/completions", json={
            "model": self.model, "messages": history, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})
        resp.raise_for_status()
        first = await _stream(self.http, self.d, {
            "model": self.model, "messages": history, "max_tokens": 16,
            "kv_transfer_params": resp.json()["kv_transfer_params"]})
        turn = self.next_turn(history, first.text, seed)
        out: dict[str, float] = {}
        # Prefill on D, while D decodes another stream: the pause it adds to that stream's gaps.
        background = asyncio.create_task(stream_chat(self.http, self.d, {
            "model": self.model, "messages": [{"role": "user", "content": "Count slowly."}],
            "max_tokens": 4000, "ignore_eos": True}))
        await asyncio.sleep(0.5)
        before = await self._stats(self.d)
        on_d = await _stream(self.http, self.d, {
            "model": self.model, "messages": turn, "max_tokens": 2})
        out["prefill_on_decode"] = on_d.ttft_ms
        await asyncio.sleep(0.2)
        after = await self._stats(self.d)
        background.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await background
        pause = float(after.get("decode_stall_ms", 0.0)) - float(before.get("decode_stall_ms", 0.0))
        itl = float(after.get("itl_ms_p50", 0.0))
        if not shared:
            await self.flush_p()
        out["recompute"] = await self._timed(turn, {"do_remote_decode": True})
        if not shared:
            await self.flush_p()
        out["pull"] = await self._timed(turn, {**first.kv_transfer_params, "do_remote_decode": True,
                                                "do_remote_prefill": False})
        return out, pause, itl, on_d.prompt_tokens

    async def _timed(self, messages: list[dict[str, str]], params: dict[str, Any]) -> float:
        """P's prefill then D's first token, as the gateway sends them (ms)."""
        started = time.perf_counter()
        resp = await self.http.post(self.p + "/v1/chat/completions", json={
            "model": self.model, "messages": messages, "max_tokens": 1, "kv_transfer_params": params})
        resp.raise_for_status()
        p_ms = (time.perf_counter() - started) * 1000
        decoded = await _stream(self.http, self.d, {
            "model": self.model, "messages": messages, "max_tokens": 2,
            "kv_transfer_params": resp.json()["kv_transfer_params"]})
        return p_ms + decoded.ttft_ms

    async def set_link(self, gbps: float) -> None:
        (await self.http.post(self.p + "/sim/link", json={"gbps": gbps, "fixed_ms": 0})).raise_for_status()


async def _measure(console: Console, stack: Stack, models: list[str], contexts: tuple[int, ...]) -> list[Point]:
    points: list[Point] = []
    async with httpx.AsyncClient(timeout=120.0) as http:
        for i, model in enumerate(models):
            grid = _Grid(http, stack, model, i)
            await grid.calibrate()
            for link in LINKS_GBPS:
                await grid.set_link(link)
                for context in contexts:  # one conversation of each length teaches the link and the curve
                    await grid.planner(context, shared=False)
                for shared in (False, True):
                    for context in contexts:
                        planned, ttft = await grid.planner(context, shared)
                        options, pause, itl, prompt = await grid.options(context, shared)
                        decision, _, reason = planned.partition("/")
                        point = Point(model, context, link, shared, decision, ttft, options, pause, itl, prompt, reason)
                        points.append(point)
                        v = verdict(point)
                        console.print(f"  {model} {context // 1000}k {link:g} GB/s {'shared' if shared else 'none'}: "
                                      f"{planned} {ttft:.0f} ms; oracle {v['oracle']} {v['oracle_ms']:.0f} ms"
                                      f"{'' if v['ok'] else '  [red]MISSED[/red]'}")
    return points


def run_grid(console: Console, data_dir: Path, out: Path, database_url: str, time_scale: float,
             models: list[str] | None = None, contexts: tuple[int, ...] = CONTEXTS) -> int:
    """Bring up the stack with the H200 profiles, measure the grid, print it and write it; 0 if every point holds."""
    models = models or list(MODELS)
    sims = [s for m in models for s in (SimSpec("prefill", m, 0, ("--prefix-cache-blocks", str(P_CACHE_BLOCKS))),
                                        SimSpec("decode", m, 0, ("--prefix-cache-blocks", str(D_CACHE_BLOCKS))))]
    stack = Stack(replace(stack_config(GATEWAY, sims, data_dir, database_url), time_scale=time_scale,
                          gateway_env={"BOOMERANG_PREFILL_ON_DECODE": "true"}))
    console.rule("[bold]The plan by predicted time to first token[/bold], against each option measured")
    console.print(f"Models {', '.join(models)}; contexts {', '.join(f'{c // 1000}k' for c in contexts)}; links "
                  f"{', '.join(f'{g:g}' for g in LINKS_GBPS)} GB/s; P's prefix cache {P_CACHE_BLOCKS} blocks, with and "
                  f"without a shared system prompt. Simulator time scale {time_scale:g}"
                  + ("" if time_scale == 1 else " (every simulated latency scaled alike: the ranking of the options "
                                                 "is unchanged, and the figures below are rescaled to model time)") + ".")
    started = time.monotonic()
    with console.status("Starting Postgres, registry, router, reaper, gateway and simulated engines…"):
        stack.start()
    try:
        points = asyncio.run(_measure(console, stack, models, contexts))
    finally:
        with console.status("Stopping…"):
            stack.stop()
    if time_scale != 1:
        for p in points:
            p.planner_ttft_ms /= time_scale
            p.options_ms = {k: v / time_scale for k, v in p.options_ms.items()}
    console.print(table(points, "Planner against the oracle (ms of time to first token)"))
    s = summary(points)
    console.print(f"Chosen option within {ORACLE_SHARE:.0%} of the oracle at {s['within_oracle']}/{s['points']} "
                  f"points, not more than {RECOMPUTE_SHARE:.0%} above recompute at {s['not_above_recompute']}/"
                  f"{s['points']}; kept on P at {s['on_p']} points, within {ORACLE_SHARE:.0%} of the better of "
                  f"recompute and pull at {s['on_p_within_best_on_p']}. The options are measured on the engines directly; the planner's TTFT goes through "
                  f"the gateway (tokenize, plan, report). D +ITL: the pause a prefill on D added to a decode "
                  f"running on D / D's median gap. {time.monotonic() - started:.0f} s.")
    write_report(out, points, time_scale)
    return 0 if s["ok"] else 1
