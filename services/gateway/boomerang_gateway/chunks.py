"""The decode engine's stream: what Boomerang captures from it and what the client sees.

vLLM (with `return_token_ids`) puts `prompt_token_ids` on the first chunk (top level for
chat, per choice for completions) and each choice's new `token_ids` on every chunk; with
bidirectional transfer the final chunk carries `kv_transfer_params`. Boomerang keeps all
three for ReportTurn and strips them from what the client receives unless the client asked
for token ids itself (the handle never leaves the gateway). A client that did not ask for
usage does not get the usage chunk the gateway requested for itself.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx2 as httpx

from boomerang_gateway.protocol import ClientRequest, Kind

DONE = "[DONE]"


async def sse_data(resp: httpx.Response) -> AsyncIterator[str]:
    """The `data:` payloads of a server-sent-event stream, one per event."""
    lines: list[str] = []
    async for line in resp.aiter_lines():
        if not line:
            if lines:
                yield "\n".join(lines)
                lines = []
            continue
        if line.startswith("data:"):
            lines.append(line[5:].lstrip(" "))
    if lines:
        yield "\n".join(lines)


_PROMPT_IDS_KEY = '"prompt_token_ids"'
_PROMPT_IDS_VALUE = re.compile(r"\s*:\s*(\[[0-9,\s]*\])\s*(,?)")


def lift_prompt_ids(data: str) -> tuple[str, str | None]:
    """A chunk's JSON without its `prompt_token_ids` list, and the list's JSON text.

    The first chunk of a long prompt carries every prompt id (29k ids: 230 KB); parsing them
    costs 3 ms, on the time to the first token. Found by a scan instead, the list is parsed
    when the report needs it, after the stream. Anything unexpected leaves the chunk whole
    (and None), for the full parse."""
    at = data.find(_PROMPT_IDS_KEY)
    while at > 0 and data[at - 1] == "\\":  # inside a string: an escaped quote
        at = data.find(_PROMPT_IDS_KEY, at + 1)
    if at < 0:
        return data, None
    value = _PROMPT_IDS_VALUE.match(data, at + len(_PROMPT_IDS_KEY))
    if value is None:
        return data, None
    start, end = at, value.end()
    if not value.group(2):  # the object's last member: drop the comma before it instead
        before = data[:at].rstrip()
        if not before.endswith(","):
            return data, None
        start = len(before) - 1
    return data[:start] + data[end:], value.group(1)


def sse(payload: dict[str, Any] | str) -> bytes:
    """One SSE event."""
    text = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return f"data: {text}\n\n".encode()


@dataclass
class Capture:
    """What the gateway learns from the decode stream for ReportTurn and metrics."""

    prompt_ids_text: str | None = None  # the prompt ids' JSON, lifted from the chunk (`lift_prompt_ids`)
    parsed_prompt_ids: list[int] | None = None
    output_token_ids: list[int] = field(default_factory=list)
    kv_transfer_params: dict[str, Any] | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    first_token_at: float | None = None  # monotonic
    last_token_at: float | None = None  # monotonic, of the last chunk that carried token ids
    finished_at: float | None = None  # wall clock (Unix seconds) of the finishing chunk

    @property
    def prompt_token_ids(self) -> list[int] | None:
        """D's prompt ids, parsed on first use."""
        if self.prompt_ids_text is not None:
            try:
                ids = json.loads(self.prompt_ids_text)
            except ValueError:  # digits and commas, but not a list (`[1,,2]`): as if none came
                ids = None
            self.parsed_prompt_ids, self.prompt_ids_text = (ids if isinstance(ids, list) else None), None
        return self.parsed_prompt_ids

    @property
    def has_prompt_ids(self) -> bool:
        """Whether D sent its prompt ids (parsed or not)."""
        return self.prompt_ids_text is not None or self.parsed_prompt_ids is not None

    def observe(self, chunk: dict[str, Any], prompt_ids_text: str | None = None) -> None:
        """Record one chunk (and the prompt ids' JSON lifted from it)."""
        if prompt_ids_text is not None:
            self.prompt_ids_text = prompt_ids_text
        if isinstance(chunk.get("prompt_token_ids"), list):
            self.parsed_prompt_ids = chunk["prompt_token_ids"]
        if isinstance(chunk.get("kv_transfer_params"), dict):
            self.kv_transfer_params = chunk["kv_transfer_params"]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if isinstance(choice.get("prompt_token_ids"), list):
                self.parsed_prompt_ids = choice["prompt_token_ids"]
            ids = choice.get("token_ids")
            if isinstance(ids, list) and ids:
                self.output_token_ids.extend(ids)
                self.last_token_at = time.monotonic()
                if self.first_token_at is None:
                    self.first_token_at = self.last_token_at
            elif self.first_token_at is None and _has_content(choice):
                self.first_token_at = time.monotonic()
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                self.finished_at = time.time()


def _has_content(choice: dict[str, Any]) -> bool:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))
    return bool(choice.get("text"))


def with_cached_tokens(usage: dict[str, Any], cached_tokens: int | None) -> dict[str, Any]:
    """`usage` with `prompt_tokens_details.cached_tokens` set to the turn's own count.

    The decode engine's figure is not the client's: D computed nothing of the prompt either
    way, and vLLM reports `prompt_tokens_details` only with `--enable-prompt-tokens-details`.
    The gateway knows what the prefill engine did not compute (`control.ReuseOutcome`), so it
    says so, as OpenAI does, on every usage object.
    """
    if cached_tokens is None:
        return usage
    details = usage.get("prompt_tokens_details")
    details = dict(details) if isinstance(details, dict) else {}
    details["cached_tokens"] = cached_tokens
    return {**usage, "prompt_tokens_details": details}


def for_client(chunk: dict[str, Any], req: ClientRequest, cached_tokens: int | None = None) -> dict[str, Any] | None:
    """The chunk as the client should see it, or None to drop it."""
    out = {k: v for k, v in chunk.items() if k != "kv_transfer_params"}
    if isinstance(out.get("usage"), dict):
        out["usage"] = with_cached_tokens(out["usage"], cached_tokens)
    if not req.wants_token_ids:
        out.pop("prompt_token_ids", None)
    choices = out.get("choices")
    if isinstance(choices, list):
        cleaned = []
        for choice in choices:
            if isinstance(choice, dict) and not req.wants_token_ids:
                choice = {k: v for k, v in choice.items() if k not in ("token_ids", "prompt_token_ids")}
            cleaned.append(choice)
        out["choices"] = cleaned
    if not req.include_usage:
        if not choices and out.get("usage") is not None:
            return None  # the usage-only chunk the gateway asked for itself
        out.pop("usage", None)
    return out


class Aggregate:
    """Folds a decode stream into one non-streamed OpenAI response: the text, tool calls and
    log probabilities; its token ids, usage and finish reason are the turn's `capture`'s, which
    observes the same chunks."""

    def __init__(self, req: ClientRequest, capture: Capture):
        self.req = req
        self.capture = capture
        self.head: dict[str, Any] = {}
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.role = "assistant"
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.logprobs: list[Any] = []
        self.stop_reason: Any = None

    def add(self, chunk: dict[str, Any]) -> None:
        """Fold one chunk in."""
        if not self.head:
            self.head = {k: chunk[k] for k in ("id", "created", "model", "system_fingerprint") if k in chunk}
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict):
                self._choice(choice)

    def _choice(self, choice: dict[str, Any]) -> None:
        if choice.get("finish_reason"):
            self.stop_reason = choice.get("stop_reason")
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict):
            self.logprobs.append(logprobs)
        if self.req.kind is Kind.COMPLETION:
            self.text.append(choice.get("text") or "")
            return
        delta = choice.get("delta") or {}
        if delta.get("role"):
            self.role = delta["role"]
        self.text.append(delta.get("content") or "")
        self.reasoning.append(delta.get("reasoning_content") or delta.get("reasoning") or "")
        for call in delta.get("tool_calls") or ():
            slot = self.tool_calls.setdefault(int(call.get("index", 0)), {"function": {"name": "", "arguments": ""}})
            if call.get("id"):
                slot["id"] = call["id"]
            if call.get("type"):
                slot["type"] = call["type"]
            fn = call.get("function") or {}
            slot["function"]["name"] += fn.get("name") or ""
            slot["function"]["arguments"] += fn.get("arguments") or ""

    def _logprobs(self) -> Any:
        if not self.logprobs:
            return None
        if self.req.kind is Kind.CHAT:
            return {"content": [c for lp in self.logprobs for c in (lp.get("content") or [])]}
        merged: dict[str, list[Any]] = {}
        for lp in self.logprobs:
            for key, value in lp.items():
                if isinstance(value, list):
                    merged.setdefault(key, []).extend(value)
        return merged

    def result(self, cached_tokens: int | None = None) -> dict[str, Any]:
        """The OpenAI response object (`cached_tokens`: see `with_cached_tokens`)."""
        capture = self.capture
        choice: dict[str, Any] = {
            "index": 0, "logprobs": self._logprobs(), "finish_reason": capture.finish_reason,
        }
        if self.stop_reason is not None:
            choice["stop_reason"] = self.stop_reason
        if self.req.kind is Kind.CHAT:
            message: dict[str, Any] = {"role": self.role, "content": "".join(self.text)}
            reasoning = "".join(self.reasoning)
            if reasoning:
                message["reasoning_content"] = reasoning
            if self.tool_calls:
                message["tool_calls"] = [
                    {"id": c.get("id", f"call_{i}"), "type": c.get("type", "function"), "function": c["function"]}
                    for i, c in sorted(self.tool_calls.items())
                ]
            choice["message"] = message
        else:
            choice["text"] = "".join(self.text)
        if self.req.wants_token_ids:
            choice["token_ids"] = capture.output_token_ids
        out: dict[str, Any] = {
            "id": self.head.get("id", ""),
            "object": "chat.completion" if self.req.kind is Kind.CHAT else "text_completion",
            "created": self.head.get("created", int(time.time())),
            "model": self.head.get("model", self.req.model),
            "choices": [choice],
        }
        if "system_fingerprint" in self.head:
            out["system_fingerprint"] = self.head["system_fingerprint"]
        if capture.usage is not None:
            out["usage"] = with_cached_tokens(capture.usage, cached_tokens)
        if self.req.wants_token_ids and capture.prompt_token_ids is not None:
            if self.req.kind is Kind.CHAT:
                out["prompt_token_ids"] = capture.prompt_token_ids
            else:
                choice["prompt_token_ids"] = capture.prompt_token_ids
        return out
