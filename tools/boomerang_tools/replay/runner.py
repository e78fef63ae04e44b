"""Replay conversations, reuse off and/or on, and summarize TTFT by context-length bucket.

AWS's advice to teams weighing KV-cache reuse: replay a recorded session with the feature
off and on and compare time to first token at your real context lengths. Off sends no
conversation id and `X-Boomerang-Reuse: off` (plain prefill→decode on a Boomerang gateway;
no id means no reuse on any proxy); on sends the conversation id (`X-Conversation-Id`, and
the body field with `send_conversation_id` as vLLM's benchmark does).
"""

from __future__ import annotations

import asyncio
import statistics
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from boomerang_tools.demo.client import REUSE_HEADER, TurnResult, stream_chat
from boomerang_tools.replay.loader import Conversation

DEFAULT_BUCKETS = (2000, 4000, 8000, 16000, 32000)


@dataclass
class Sample:
    """One replayed turn."""

    mode: str
    conversation_id: str
    turn: int
    result: TurnResult


@dataclass
class ReplayOptions:
    """How to replay."""

    url: str
    modes: tuple[str, ...] = ("off", "on")
    model: str = ""
    api_key: str = ""
    concurrency: int = 1
    max_tokens: int | None = None
    send_conversation_id: bool = False
    timeout: float = 300.0


@dataclass
class ReplayResult:
    """Every sample."""

    samples: list[Sample] = field(default_factory=list)

    @property
    def failed(self) -> list[Sample]:
        """Turns that did not complete."""
        return [s for s in self.samples if not s.result.ok]


def bucket_of(tokens: int, edges: tuple[int, ...]) -> str:
    """The bucket label of a prompt length, e.g. `2k–4k`."""
    low = 0
    for edge in edges:
        if tokens < edge:
            return f"{_k(low)}–{_k(edge)}"
        low = edge
    return f"≥{_k(low)}"


def _k(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summarize(result: ReplayResult, edges: tuple[int, ...]) -> list[dict[str, Any]]:
    """Per bucket: turns and TTFT p50/p90 per mode, and the speedup of the medians."""
    groups: dict[str, dict[str, list[Sample]]] = {}
    order: dict[str, int] = {}
    for s in result.samples:
        if not s.result.ok or not s.result.prompt_tokens:
            continue
        label = bucket_of(s.result.prompt_tokens, edges)
        order.setdefault(label, s.result.prompt_tokens)
        order[label] = min(order[label], s.result.prompt_tokens)
        groups.setdefault(label, {}).setdefault(s.mode, []).append(s)
    rows = []
    for label in sorted(groups, key=lambda b: order[b]):
        row: dict[str, Any] = {"bucket": label}
        for mode, samples in sorted(groups[label].items()):
            ttfts = [s.result.ttft_ms for s in samples]
            row[mode] = {
                "turns": len(samples),
                "ttft_p50_ms": round(statistics.median(ttfts), 1),
                "ttft_p90_ms": round(_percentile(ttfts, 0.9), 1),
                "mean_prompt_tokens": round(statistics.fmean(s.result.prompt_tokens for s in samples)),
                "plans": _count(s.result.plan or "—" for s in samples),
            }
        if "off" in row and "on" in row and row["on"]["ttft_p50_ms"] > 0:
            row["speedup"] = round(row["off"]["ttft_p50_ms"] / row["on"]["ttft_p50_ms"], 2)
        rows.append(row)
    return rows


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


async def _model(http: httpx.AsyncClient, opts: ReplayOptions, headers: dict[str, str]) -> str:
    resp = await http.get(opts.url.rstrip("/") + "/v1/models", headers=headers, timeout=30)
    resp.raise_for_status()
    data = resp.json().get("data") or []
    if not data:
        raise RuntimeError(f"{opts.url}/v1/models lists no model; give --model")
    return str(data[0]["id"])


async def _replay_one(
    http: httpx.AsyncClient, conv: Conversation, mode: str, run_id: str, opts: ReplayOptions, model: str,
    headers: dict[str, str], out: ReplayResult, on_turn: Callable[[], None],
) -> None:
    cid = f"{conv.conversation_id}-{run_id}"
    history = list(conv.system)
    for i, turn in enumerate(conv.turns):
        if turn.body is not None:
            body = dict(turn.body)
        else:
            assert turn.user is not None
            history.append(turn.user)
            body = {"messages": list(history)}
        body["model"] = opts.model or body.get("model") or model
        if opts.max_tokens is not None:
            body["max_tokens"] = opts.max_tokens
            body.pop("max_completion_tokens", None)
        hdrs = dict(headers)
        if mode == "off":
            hdrs[REUSE_HEADER] = "off"
        else:
            hdrs["X-Conversation-Id"] = cid
            if opts.send_conversation_id:
                body["conversation_id"] = cid
        result = await stream_chat(http, opts.url, body, hdrs, timeout=opts.timeout)
        out.samples.append(Sample(mode, conv.conversation_id, i, result))
        on_turn()
        if not result.ok:
            for _ in conv.turns[i + 1:]:
                on_turn()
            return
        if turn.user is not None:
            history.append({"role": "assistant", "content": result.text})


async def check_reachable(url: str) -> None:
    """Connect to the endpoint once before replaying anything.

    One that cannot be reached raises httpx's ConnectError (or ConnectTimeout) here, which
    `boomerang` reports as one line, rather than failing every turn after a table of nothing.
    Any answer, even an error status or a slow one, means it is there: the turns say the rest."""
    async with httpx.AsyncClient(timeout=10.0) as http:
        try:
            await http.get(url.rstrip("/") + "/v1/models")
        except (httpx.ConnectError, httpx.ConnectTimeout):
            raise
        except httpx.HTTPError:
            return


async def replay(
    conversations: list[Conversation], opts: ReplayOptions, on_turn: Callable[[], None] = lambda: None
) -> ReplayResult:
    """Replay every conversation in each mode (all of one mode, then the next)."""
    out = ReplayResult()
    headers = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
    limits = httpx.Limits(max_connections=max(4, opts.concurrency * 2))
    async with httpx.AsyncClient(limits=limits, timeout=opts.timeout) as http:
        model = opts.model or (await _model(http, opts, headers) if any(
            t.body is None or not t.body.get("model") for c in conversations for t in c.turns) else "")
        for mode in opts.modes:
            run_id = uuid.uuid4().hex[:8]
            gate = asyncio.Semaphore(opts.concurrency)

            async def one(
                conv: Conversation, mode: str = mode, run_id: str = run_id, gate: asyncio.Semaphore = gate
            ) -> None:
                async with gate:
                    await _replay_one(http, conv, mode, run_id, opts, model, headers, out, on_turn)

            await asyncio.gather(*(one(c) for c in conversations))
    return out
