"""vLLM's OpenAI-server request parsing and response shapes, as the simulator serves them.

Shapes follow vLLM 0.33's `ChatCompletionResponse`, `ChatCompletionStreamResponse`,
`CompletionResponse` and `CompletionStreamResponse`: non-streaming bodies carry every field
(null when unset), stream chunks only the fields that are set. With `return_token_ids`
the prompt's ids come as `prompt_token_ids` (chat: top level; completions: in the choice;
streaming: first chunk) and each choice carries its generated `token_ids` (deltas when
streaming). `kv_transfer_params` is top level: always present (maybe null) when not
streaming, and on the chunk that carries `finish_reason` when streaming. Errors are
`{"error": {"message", "type", "param", "code"}}`.

Not simulated (rejected with 400 rather than silently ignored): `n` > 1, `echo`, batched
prompts, non-text content parts. Sampling knobs (temperature, top_p, seed, stop, …) are
accepted and ignored: the output is a fixed function of the context.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from boomerang_tools.sim import template
from boomerang_tools.sim.tokenizer import END_OF_TEXT, IM_END, SPECIAL_BY_ID, VOCAB_SIZE, encode

# Qwen's instruct models end a chat turn with <|im_end|> and raw text with <|endoftext|>.
EOS_CHAT = SPECIAL_BY_ID[IM_END]
EOS_COMPLETION = SPECIAL_BY_ID[END_OF_TEXT]


class ProtocolError(Exception):
    """A request vLLM would refuse: status, OpenAI error type, message, offending field."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.param = status, kind, param


def error_body(status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    """vLLM's ErrorResponse."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


@dataclass(frozen=True)
class Parsed:
    """A generation request after parsing: the engine's view plus response options."""

    kind: str  # "chat" or "completion"
    model: str
    prompt_ids: list[int]
    max_tokens: int | None
    stream: bool
    include_usage: bool
    return_token_ids: bool
    ignore_eos: bool
    min_tokens: int
    kv_transfer_params: Any


def _bool(body: dict[str, Any], key: str, default: bool = False) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ProtocolError(400, f"{key}: must be a boolean", param=key)
    return value


def _int(body: dict[str, Any], key: str, minimum: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ProtocolError(400, f"{key}: must be an integer of at least {minimum}", param=key)
    return value


def served_model(body: Any, served: str) -> str:
    """The model a request body names (its own, or the one served), if it is an object naming
    the served model (shared with `/tokenize`)."""
    if not isinstance(body, dict):
        raise ProtocolError(400, "The request body must be a JSON object.")
    model = body.get("model") or served
    if model != served:
        raise ProtocolError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    return str(model)


def _parse(kind: str, body: Any, served: str, prompt_ids: Any, max_tokens: Any) -> Parsed:
    """What both endpoints share; `prompt_ids` and `max_tokens` read the rest of the body."""
    model = served_model(body, served)
    if body.get("n", 1) not in (1, None):
        raise ProtocolError(400, "n: only n=1 is simulated", param="n")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ProtocolError(400, "stream_options: must be an object", param="stream_options")
    stream = _bool(body, "stream")
    params = body.get("kv_transfer_params")
    if params is not None and not isinstance(params, dict):
        raise ProtocolError(400, "kv_transfer_params: must be an object", param="kv_transfer_params")
    return Parsed(
        kind=kind,
        model=model,
        stream=stream,
        include_usage=bool(options.get("include_usage")) and stream,
        return_token_ids=_bool(body, "return_token_ids"),
        ignore_eos=_bool(body, "ignore_eos"),
        min_tokens=_int(body, "min_tokens", 0) or 0,
        kv_transfer_params=params,
        # Checked after the options above (which error a body with several reports first).
        max_tokens=max_tokens(body),
        prompt_ids=prompt_ids(body),
    )


def parse_chat(body: Any, served: str, strip_reasoning: bool) -> Parsed:
    """A `/v1/chat/completions` body."""

    def max_tokens(body: dict[str, Any]) -> int | None:
        limit = _int(body, "max_completion_tokens", 1)
        return _int(body, "max_tokens", 1) if limit is None else limit

    return _parse("chat", body, served, lambda b: chat_prompt_ids(b, strip_reasoning), max_tokens)


def chat_prompt_ids(body: dict[str, Any], strip_reasoning: bool) -> list[int]:
    """Apply the chat template and tokenize (shared with `/tokenize`)."""
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise ProtocolError(400, "tools: must be a list", param="tools")
    try:
        text = template.render(
            body.get("messages"),
            _bool(body, "add_generation_prompt", True),
            strip_reasoning,
            tools,
        )
    except template.TemplateError as exc:
        raise ProtocolError(400, str(exc), param="messages") from None
    return encode(text)


def completion_prompt_ids(body: dict[str, Any]) -> list[int]:
    """A completions `prompt`: a string, token ids, or a batch of exactly one of those."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return encode(prompt)
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):  # not bool, a subclass
        if min(prompt) < 0 or max(prompt) >= VOCAB_SIZE:
            raise ProtocolError(400, f"prompt: token ids must be in [0, {VOCAB_SIZE})", param="prompt")
        return list(prompt)
    raise ProtocolError(400, "prompt: must be a string or a list of token ids (one prompt per request)", param="prompt")


def parse_completion(body: Any, served: str) -> Parsed:
    """A `/v1/completions` body (max_tokens defaults to 16, as in vLLM)."""

    def max_tokens(body: dict[str, Any]) -> int:
        if body.get("echo"):
            raise ProtocolError(400, "echo: not simulated", param="echo")
        limit = _int(body, "max_tokens", 1)
        return 16 if limit is None else limit

    return _parse("completion", body, served, completion_prompt_ids, max_tokens)


# Where a stream chunk's prompt ids go, replaced by their JSON text made in advance.
_PROMPT_IDS = "\x00prompt_token_ids\x00"
_PROMPT_IDS_TEXT = json.dumps(_PROMPT_IDS)


class ResponseBuilder:
    """Builds one request's response body or stream chunks."""

    def __init__(self, p: Parsed, response_id: str, prompt_tokens_details: bool = False):
        self.p = p
        self.details = prompt_tokens_details
        self.cached_tokens = 0  # set from the request's Finish
        self.id = response_id
        self.created = int(time.time())
        self.sent_first = False
        # The prompt ids' JSON is made here, inside the modelled step: made when the first
        # token is written it would add the simulator's own time to that token (3 ms for 29k
        # ids), where vLLM's serializer is native code.
        self._prompt_ids_json = json.dumps(p.prompt_ids, separators=(",", ":")) if p.return_token_ids and p.stream else ""

    def _head(self) -> dict[str, Any]:
        obj = "chat.completion" if self.p.kind == "chat" else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.p.model}

    def _usage(self, completion: int) -> dict[str, Any]:
        """UsageInfo; the cached tokens (vLLM's num_cached_tokens) only with
        --enable-prompt-tokens-details."""
        prompt = len(self.p.prompt_ids)
        cached = {"cached_tokens": self.cached_tokens} if self.details else None
        return {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                "completion_tokens": completion, "prompt_tokens_details": cached}

    def full(self, text: str, ids: list[int], finish: str, kv: dict[str, Any] | None) -> dict[str, Any]:
        """The non-streaming response."""
        p = self.p
        tok = ids if p.return_token_ids else None
        prompt_ids = p.prompt_ids if p.return_token_ids else None
        if p.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
                       "function_call": None, "tool_calls": [], "reasoning_content": None}
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
                                      "stop_reason": None, "token_ids": tok}
            extra = {"service_tier": None, "system_fingerprint": None, "usage": self._usage(len(ids)),
                     "prompt_logprobs": None, "prompt_token_ids": prompt_ids, "kv_transfer_params": kv}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None,
                      "prompt_logprobs": None, "prompt_token_ids": prompt_ids, "token_ids": tok}
            extra = {"service_tier": None, "system_fingerprint": None, "usage": self._usage(len(ids)),
                     "kv_transfer_params": kv}
        return {**self._head(), "choices": [choice], **extra}

    def chunks(self, text: str, token_id: int, finish: str | None, kv: dict[str, Any] | None) -> list[str]:
        """The stream chunks' JSON for one generated token (the first token also opens the stream)."""
        p, out = self.p, []
        head = {**self._head(), "object": "chat.completion.chunk" if p.kind == "chat" else "text_completion"}
        first = not self.sent_first
        self.sent_first = True
        if p.kind == "chat":
            if first:  # vLLM opens with the role, and the prompt ids when asked
                opening: dict[str, Any] = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                                "logprobs": None, "finish_reason": None}]}
                if p.return_token_ids:
                    opening["prompt_token_ids"] = _PROMPT_IDS
                out.append(self._json(opening))
            choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            if first and p.return_token_ids:
                choice["prompt_token_ids"] = _PROMPT_IDS
        if finish is not None:
            choice["stop_reason"] = None
        if p.return_token_ids:
            choice["token_ids"] = [token_id]
        chunk: dict[str, Any] = {**head, "choices": [choice]}
        if kv is not None:
            chunk["kv_transfer_params"] = kv
        out.append(self._json(chunk))
        return out

    def _json(self, chunk: dict[str, Any]) -> str:
        """A chunk's JSON, the prompt ids' text (made in advance) in place of their placeholder."""
        text = json.dumps(chunk, separators=(",", ":"))
        return text.replace(_PROMPT_IDS_TEXT, self._prompt_ids_json, 1) if self._prompt_ids_json else text

    def usage_chunk(self, completion_tokens: int) -> dict[str, Any]:
        """The trailing usage-only chunk (stream_options.include_usage)."""
        head = {**self._head(), "object": "chat.completion.chunk" if self.p.kind == "chat" else "text_completion"}
        return {**head, "choices": [], "usage": self._usage(completion_tokens)}
