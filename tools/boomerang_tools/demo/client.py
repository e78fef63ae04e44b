"""One streamed chat turn against any OpenAI-compatible endpoint, timed from the client.

Time to first token (TTFT) is measured as a client sees it: from sending the request to the
first streamed chunk that carries generated content. Used by `boomerang demo` and
`boomerang replay`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

REUSE_HEADER = "X-Boomerang-Reuse"


@dataclass
class TurnResult:
    """What one turn returned, as the client measured it."""

    ok: bool
    status: int = 0
    ttft_ms: float = 0.0
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    plan: str = ""
    reason: str = ""
    reused_tokens: int = 0
    cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens (vLLM's --enable-prompt-tokens-details)
    error: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    # The engine's, when the turn was sent to an engine directly.
    kv_transfer_params: dict[str, Any] = field(default_factory=dict)


def server_timing(headers: dict[str, str]) -> dict[str, float]:
    """`Server-Timing: tokenize;dur=3.1, plan;dur=1.2` as {"tokenize": 3.1, "plan": 1.2} (ms)."""
    out: dict[str, float] = {}
    for part in headers.get("server-timing", "").split(","):
        name, _, rest = part.strip().partition(";dur=")
        try:
            out[name] = float(rest)
        except ValueError:
            continue
    return out


def _content(chunk: dict[str, Any]) -> str:
    out = []
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict):
            out.append((delta.get("content") or "") + (delta.get("reasoning_content") or ""))
        elif isinstance(choice, dict):
            out.append(choice.get("text") or "")
    return "".join(out)


async def stream_chat(
    http: httpx.AsyncClient,
    base_url: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    timeout: float = 120.0,
) -> TurnResult:
    """POST a streamed chat completion and time it; never raises for HTTP trouble."""
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    url = base_url.rstrip("/") + "/v1/chat/completions"
    started = time.perf_counter()
    result = TurnResult(ok=False)
    try:
        async with http.stream("POST", url, json=payload, headers=headers or {}, timeout=timeout) as resp:
            result.status = resp.status_code
            result.headers = {k.lower(): v for k, v in resp.headers.items()
                              if k.lower().startswith("x-boomerang") or k.lower() == "server-timing"}
            result.plan = resp.headers.get("x-boomerang-plan", "")
            result.reason = resp.headers.get("x-boomerang-reason", "")
            reused = resp.headers.get("x-boomerang-reused-tokens", "0")
            result.reused_tokens = int(reused) if reused.isdigit() else 0
            if resp.status_code != 200:
                result.error = (await resp.aread()).decode("utf-8", "replace")[:500]
                return result
            pieces: list[str] = []
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    result.ok = True
                    break
                chunk = json.loads(data)
                if "error" in chunk and not chunk.get("choices"):
                    result.error = json.dumps(chunk["error"])[:500]
                    break
                text = _content(chunk)
                if text and not result.ttft_ms:
                    result.ttft_ms = (time.perf_counter() - started) * 1000
                pieces.append(text)
                if chunk.get("kv_transfer_params"):
                    result.kv_transfer_params = chunk["kv_transfer_params"]
                usage = chunk.get("usage")
                if isinstance(usage, dict):
                    result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    result.completion_tokens = int(usage.get("completion_tokens") or 0)
                    details = usage.get("prompt_tokens_details")
                    if isinstance(details, dict):
                        result.cached_tokens = int(details.get("cached_tokens") or 0)
            result.text = "".join(pieces)
    except (httpx.HTTPError, ValueError) as exc:
        result.error = repr(exc)
        result.ok = False
    if result.ok and not result.ttft_ms:
        result.ok, result.error = False, "the stream carried no content"
    return result
