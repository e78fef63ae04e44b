"""Chat turns three ways, interleaved in one run: through the gateway, through the naive
proxy, and straight to the simulated engines (the client does the P→D hand-off itself);
with `hook` in the job, the same three over a second pair of engines that run the vLLM
hook (`sim --hook`, model `hook_model`): `hook` through a gateway in `--engine-hook` mode
(the engines plan and register themselves), `naive-hook` and `direct-hook` with no
conversation id (the hook is installed but does nothing), so each pair of engines carries
the same load and hook mode is judged against its own direct path and naive proxy.

Every path runs the same multi-turn conversations (the assistant's reply appended, a new
user message each turn) at the same concurrency in the same seconds, so the machine's
noise lands on all three alike. A turn's time is from sending the request to the last byte
of the streamed answer. What a path *adds* is its time less the direct path's. A turn's end
is the time from its finishing chunk (the one with `finish_reason`) to the end of the
stream: where the gateway waits for ReportTurn's answer (the next turn's lease committed)
before `[DONE]`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
import uuid
from array import array
from collections import Counter
from typing import Any

import httpx

from boomerang_tools.bench.naive_proxy import FIRST_TURN

WORDS = ["the", "decode", "node", "keeps", "every", "block", "of", "the", "finished", "turn", "so", "that", "the", "prefill", "node", "of", "the", "next", "turn", "can", "read", "them", "back", "instead", "of", "computing", "the", "whole", "history", "again"]
PATHS = ("direct", "naive", "boomerang", "direct-hook", "naive-hook", "hook")
HOOK_PATHS = ("direct-hook", "naive-hook", "hook")


def user_message(rng: random.Random, words: int) -> str:
    """A user message of about `words` words."""
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def _stream(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], ends: list[float] | None = None
) -> tuple[str, dict[str, Any] | None, dict[str, str]]:
    """POST a streaming chat request; the reply text, the final kv_transfer_params, headers.

    `ends` gets the milliseconds from the finishing chunk to the end of the stream.
    """
    text: list[str] = []
    params = None
    finished_at = None
    async with http.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code} from {url}: {(await resp.aread())[:200]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                text.append((choice.get("delta") or {}).get("content") or "")
                if choice.get("finish_reason") and finished_at is None:
                    finished_at = time.perf_counter()
            if isinstance(chunk.get("kv_transfer_params"), dict):
                params = chunk["kv_transfer_params"]
        if ends is not None and finished_at is not None:
            ends.append((time.perf_counter() - finished_at) * 1000)
        return "".join(text), params, dict(resp.headers)


class DirectClient:
    """The client does what a proxy would: P with the last handle, then D streaming."""

    def __init__(self, http: httpx.AsyncClient, prefill: str, decode: str):
        self.http, self.prefill, self.decode = http, prefill, decode
        self.kv: dict[str, dict[str, Any]] = {}

    async def turn(
        self, conversation_id: str, body: dict[str, Any], ends: list[float] | None = None
    ) -> tuple[str, dict[str, str], bool]:
        """One turn; the reply, headers, whether a handle was passed to P."""
        handle = self.kv.pop(conversation_id, None)
        p_body = dict(body, max_tokens=1, stream=False, kv_transfer_params=handle or dict(FIRST_TURN))
        p_body.pop("stream_options", None)
        p = await self.http.post(self.prefill + "/v1/chat/completions", json=p_body)
        p.raise_for_status()
        params = p.json().get("kv_transfer_params")
        text, d_params, headers = await _stream(self.http, self.decode + "/v1/chat/completions",
                                                dict(body, kv_transfer_params=params), ends)
        if d_params is not None:
            self.kv[conversation_id] = d_params
        return text, headers, handle is not None


async def turns_job(job: dict[str, Any], index: int) -> dict[str, Any]:
    """Run conversations on every path until the duration is over."""
    http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=5.0),
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))
    direct = DirectClient(http, job["prefill"], job["decode"])
    direct_hook = DirectClient(http, job.get("prefill_hook", ""), job.get("decode_hook", ""))
    urls = {"naive": job["naive"] + "/v1/chat/completions", "boomerang": job["gateway"] + "/v1/chat/completions",
            "hook": job.get("hook", "") + "/v1/chat/completions",
            "naive-hook": job.get("naive_hook", "") + "/v1/chat/completions"}
    times: dict[str, list[float]] = {p: [] for p in PATHS}
    ends: dict[str, list[float]] = {p: [] for p in PATHS}
    stages: dict[str, list[float]] = {}
    plans: Counter[str] = Counter()
    hook_plans: Counter[str] = Counter()  # the hook path's X-Boomerang-Plan (ENGINE: the engine planned)
    reused: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    done: Counter[str] = Counter()  # every answered turn, first turns too
    end = 0.0

    async def conversation_loop(path: str, slot: int) -> None:
        rng = random.Random(hash((index, path, slot)))
        for n in itertools.count():
            cid = f"bench-{path}-{index}-{slot}-{n}-{uuid.uuid4().hex[:6]}"
            system = user_message(rng, job["system_words"]) if job.get("system_words") else "You are a helpful assistant."
            messages = [{"role": "system", "content": system}]
            for turn in range(job["turns_per_conversation"]):
                if time.perf_counter() >= end:
                    return
                messages.append({"role": "user", "content": user_message(rng, job["words"])})
                model = job["hook_model"] if path in HOOK_PATHS else job["model"]
                body = {"model": model, "messages": list(messages), "max_tokens": job["max_tokens"], "stream": True}
                t0 = time.perf_counter()
                end_ms: list[float] = []
                try:
                    if path in ("direct", "direct-hook"):
                        text, headers, had = await (direct if path == "direct" else direct_hook).turn(cid, body, end_ms)
                        reused[path] += had
                    else:
                        text, _, headers = await _stream(http, urls[path], dict(body, conversation_id=cid), end_ms)
                except Exception as exc:  # noqa: BLE001 - counted, the run goes on
                    errors[f"{path}:{type(exc).__name__}"] += 1
                    break
                elapsed = (time.perf_counter() - t0) * 1000
                done[path] += 1
                if turn >= 1:  # first turns are cold everywhere; compare the reuse turns
                    times[path].append(elapsed)
                    ends[path].extend(end_ms)
                    if path == "hook":
                        hook_plans[headers.get("x-boomerang-plan", "?")] += 1
                    if path == "boomerang":
                        plans[headers.get("x-boomerang-plan", "?")] += 1
                        for part in headers.get("server-timing", "").split(","):
                            name, _, dur = part.strip().partition(";dur=")
                            if dur:
                                stages.setdefault(name, []).append(float(dur))
                messages.append({"role": "assistant", "content": text})
                # Let the previous turn's ReportTurn land before the next plan, as an agent's
                # tool call would; every path waits the same.
                await asyncio.sleep(job["think_seconds"])

    delay = job["start_at"] - time.time()
    if delay > 0:
        await asyncio.sleep(delay)
    end = time.perf_counter() + job["duration"]
    try:
        paths = job.get("paths") or [p for p in PATHS if p not in HOOK_PATHS or job.get("hook")]
        await asyncio.gather(*(conversation_loop(p, s) for p in paths for s in range(job["slots"])))
    finally:
        await http.aclose()
    return {
        "times_ms": {p: array("d", v).tobytes() for p, v in times.items()},
        "ends_ms": {p: array("d", v).tobytes() for p, v in ends.items()},
        "stages_ms": {k: array("d", v).tobytes() for k, v in stages.items()},
        "plans": dict(plans),
        "hook_plans": dict(hook_plans),
        "reused": dict(reused),
        "errors": dict(errors),
        "turns": dict(done),
    }
