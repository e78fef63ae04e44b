"""Run the demo's conversations through the gateway, Boomerang off and on, and collect TTFTs.

Off: in a deployment with no Boomerang in it (`modes.OFF`), every turn carries
`X-Boomerang-Reuse: off` and no conversation id, so the gateway sends the prefill engine the
first-turn form and P computes the whole prompt (prefix caching is off on the simulated P,
as in AWS's tests). On: every turn carries its conversation id (or none, in a mode that
sends none: the router then finds the turn by its prompt), so turns 2+ pull the previous
turn's KV from the decode engine. "On" is measured once per deployment (`modes.py`: the
gateway plans, or the engines' hook does); "off" is the same plain prefill→decode for all
of them, so it is measured once.

Conversations run one at a time, as a single client would measure them:
on a small machine concurrent conversations would compete for the CPU that the gateway,
router and simulated engines share, and that noise is not the engines' latency. Between
turns the agent "runs its tool" for `THINK_SECONDS`, as real agents do, which also lets
the previous turn's ReportTurn land before the next turn is planned.

Many conversations sharing one prefill engine (`run_rotation`) take their turns in rotation,
one request at a time: while one agent runs its tool the others send their turns, so the
prefill engine sees the requests of N concurrent agents in the order it would, and each
turn's TTFT is still measured alone (the simulator models no batching, so sending them at
once would measure only this machine's CPU).
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import xxhash

from boomerang_tools.demo.client import REUSE_HEADER, TurnResult, server_timing, stream_chat
from boomerang_tools.demo.workload import AgentConversation, Step, prepare, steps
from boomerang_tools.sim.costmodel import profile as sim_profile

SIM_BLOCK_SIZE = 16  # the simulated engines' KV block (`sim --block-size`'s default)

THINK_SECONDS = 0.3


@dataclass
class Record:
    """One turn of one conversation."""

    profile: str
    mode: str  # "off" or "on"
    rep: int
    deployment: str  # the `modes.Mode` name the turn ran under ("gateway", "hook")
    step: Step | None  # None: the kickoff turn
    prompt_tokens: int
    result: TurnResult
    conversations: int = 1  # conversations sharing the prefill engine, their turns in rotation


@dataclass
class RunResult:
    """Everything a demo run measured."""

    records: list[Record] = field(default_factory=list)
    conversation_ids: dict[tuple[str, int], str] = field(default_factory=dict)

    @property
    def failed(self) -> list[Record]:
        """Turns that did not complete."""
        return [r for r in self.records if not r.result.ok]

    def _probes(self, profile: str, mode: str, point: int, deployment: str | None, conversations: int = 1) -> list[Record]:
        return [r for r in self.records if r.profile == profile and r.mode == mode and r.step and r.step.probe
                and r.step.point == point and (deployment is None or r.deployment == deployment)
                and r.conversations == conversations]

    def ttft(self, profile: str, mode: str, point: int, deployment: str | None = None,
             conversations: int = 1) -> float | None:
        """Median probe TTFT (ms) over repetitions or concurrent conversations (of one deployment, or any)."""
        values = [r.result.ttft_ms for r in self._probes(profile, mode, point, deployment, conversations) if r.result.ok]
        return statistics.median(values) if values else None

    def cached(self, profile: str, point: int, deployment: str, conversations: int = 1) -> float | None:
        """Median prompt tokens the measured turns at `point` did not compute (the usage's cached_tokens)."""
        values = [r.result.cached_tokens for r in self._probes(profile, "on", point, deployment, conversations)
                  if r.result.ok]
        return statistics.median(values) if values else None

    def probe_plans(self, profile: str, point: int, deployment: str | None = None) -> str:
        """Tokens the measured turns at `point` took from the decode engine with Boomerang on
        (e.g. `23,872`: the prefill engine's cached tokens as the client's usage reports them,
        which is all a client sees when the engines plan), else the gateway's plan and reason."""
        seen = []
        for r in self._probes(profile, "on", point, deployment):
            res = r.result
            if res.cached_tokens:
                seen.append(f"{res.cached_tokens:,}")
            elif res.plan == "PULL":
                seen.append(f"{res.reused_tokens:,}")
            elif res.reason == "ROUTER_NOT_CONFIGURED":
                seen.append("0 (missed)")  # no Boomerang: only the prefill engine's own cache reuses
            else:
                seen.append(f"{res.plan or 'FAILED'} ({res.reason})" if res.plan != "ENGINE" else "recomputed")
        return ", ".join(dict.fromkeys(seen)) or "—"

    def first_turn_delta_ms(self, profile: str, deployment: str) -> float | None:
        """Median over repetitions of a conversation's first turn (nothing to pull) TTFT with
        Boomerang on less off: the same prompt both ways (one seed per repetition)."""
        def kickoffs(mode: str, name: str | None) -> dict[int, float]:
            return {r.rep: r.result.ttft_ms for r in self.records
                    if r.profile == profile and r.mode == mode and r.step is None and r.conversations == 1
                    and r.result.ok and (name is None or r.deployment == name)}
        on, off = kickoffs("on", deployment), kickoffs("off", None)
        values = [on[rep] - off[rep] for rep in on.keys() & off.keys()]
        return statistics.median(values) if values else None

    def overhead_ms(self, profile: str, point: int, deployment: str | None = None) -> float | None:
        """Median time the gateway spent on Boomerang's own steps (tokenize + plan) for the
        measured turns at `point` with Boomerang on (none when the engines plan)."""
        values = []
        for r in self._probes(profile, "on", point, deployment):
            timing = server_timing(r.result.headers)
            if "plan" in timing:
                values.append(timing.get("tokenize", 0.0) + timing.get("report_wait", 0.0) + timing["plan"])
        return statistics.median(values) if values else None

    def ceiling(self, profile: str, point: int, deployment: str, block_size: int = SIM_BLOCK_SIZE) -> float | None:
        """Median speedup the simulator's own cost model gives the measured turns at `point`
        when nothing but the engines costs time: TTFT computing the whole prompt over TTFT
        pulling every whole block of the previous turn's sequence (prompt and reply, which
        the decode engine retained) and computing the rest. What a measured speedup is held
        against: the share of it that survives Boomerang's own path."""
        turns = [r for r in self.records if r.profile == profile and r.mode == "on" and r.deployment == deployment
                 and r.conversations == 1]
        model = sim_profile(profile)
        values = []
        for rep in {r.rep for r in turns}:
            mine = [r for r in turns if r.rep == rep]
            for previous, r in itertools.pairwise(mine):
                if not (r.step and r.step.probe and r.step.point == point and previous.result.ok):
                    continue
                retained = previous.prompt_tokens + previous.result.completion_tokens
                pulled = min(retained // block_size * block_size, (r.prompt_tokens - 1) // block_size * block_size)
                values.append(model.ttft_ms(r.prompt_tokens) / model.ttft_ms(r.prompt_tokens, max(pulled, 0)))
        return statistics.median(values) if values else None

    def mismatched_replies(self) -> int:
        """Turns whose reply with Boomerang on (in any deployment) differs from off's (a wrong
        KV would change the reply)."""
        by_key: dict[tuple[str, int, int, bool, int], dict[str, str]] = {}
        for r in self.records:
            if r.result.ok:
                key = (r.profile, r.rep, r.step.point if r.step else 0, r.step.probe if r.step else False,
                       r.conversations)
                by_key.setdefault(key, {})["off" if r.mode == "off" else f"on/{r.deployment}"] = r.result.text
        return sum(1 for v in by_key.values() if "off" in v for k, text in v.items() if k != "off" and text != v["off"])


def id_headers(conversation_id: str, send_id: bool) -> dict[str, str]:
    """A turn's headers with Boomerang on: its conversation id, or nothing at all."""
    return {"X-Conversation-Id": conversation_id} if send_id else {}


async def _converse(
    http: httpx.AsyncClient,
    gateway_url: str,
    profile: str,
    convs: dict[int, tuple[AgentConversation, dict[str, str]]],
    points: tuple[int, ...],
    out: RunResult,
    on_turn: Callable[[], None],
    deployment: str,
    mode: str = "on",
    think: float = 0.0,
) -> None:
    """The agent sessions of `convs` (by repetition: the session and its headers), each turn
    of each in rotation, one request at a time, `think` seconds after each reply; a session
    whose turn fails stops, the others go on."""
    plan: list[Step | None] = [None, *steps(points)]
    live = set(convs)
    for j, step in enumerate(plan):
        for rep, (conv, headers) in convs.items():
            if rep not in live:
                continue
            prompt = conv.prompt_tokens() if step is None else prepare(conv, step)
            result = await stream_chat(http, gateway_url, conv.body(), headers)
            record = Record(profile, mode, rep, deployment, step, prompt, result, len(convs))
            out.records.append(record)
            on_turn()
            if not result.ok:
                live.discard(rep)
                for _ in plan[j + 1:]:
                    on_turn()
                continue
            conv.add_reply(result.text)
            if think:
                await asyncio.sleep(think)


async def run_profile(
    gateway_url: str,
    profile: str,
    model: str,
    points: tuple[int, ...],
    reps: int,
    out: RunResult,
    on_turn: Callable[[], None],
    deployment: str = "gateway",
    mode: str = "on",
    send_id: bool = True,
) -> None:
    """All conversations of one profile in one deployment, one per repetition, one after the
    other, Boomerang `mode` ("off": the baseline's deployment, or "on")."""
    run_id = uuid.uuid4().hex[:8]
    async with httpx.AsyncClient(timeout=120.0) as http:
        for rep in range(reps):
            cid = f"demo-{profile}-{deployment}-{run_id}-{rep}"
            out.conversation_ids.setdefault((profile, rep), cid)
            seed = xxhash.xxh3_64_intdigest(f"{profile}/{rep}".encode())
            conv = AgentConversation(seed=seed, model=model)
            headers = {REUSE_HEADER: "off"} if mode == "off" else id_headers(cid, send_id)
            await _converse(http, gateway_url, profile, {rep: (conv, headers)}, points, out, on_turn,
                            deployment, mode, THINK_SECONDS)


async def run_rotation(
    gateway_url: str,
    profile: str,
    model: str,
    points: tuple[int, ...],
    conversations: int,
    out: RunResult,
    on_turn: Callable[[], None],
    deployment: str,
    send_id: bool = True,
) -> None:
    """`conversations` agent sessions sharing the engines, each turn of each in rotation (one
    request at a time); a conversation whose turn fails stops, the others go on."""
    run_id = uuid.uuid4().hex[:8]
    convs = {}
    for i in range(conversations):
        seed = xxhash.xxh3_64_intdigest(f"{profile}/x{conversations}/{i}".encode())
        convs[i] = (AgentConversation(seed=seed, model=model),
                    id_headers(f"demo-{profile}-{deployment}-x{conversations}-{run_id}-{i}", send_id))
    async with httpx.AsyncClient(timeout=120.0) as http:
        await _converse(http, gateway_url, profile, convs, points, out, on_turn, deployment)


def turns_per_profile(points: tuple[int, ...], reps: int) -> int:
    """Turns one profile sends in one deployment (for the progress bar)."""
    return reps * (1 + 2 * len(points))
