"""Client requests in, engine requests out: the OpenAI shapes and vLLM's P/D contract.

Pure functions, no I/O. A client body is validated just enough to route it (the engines
judge the rest); Boomerang's own fields (`conversation_id`) are taken out and never reach an
engine, and a client's `kv_transfer_params` is always dropped — otherwise a client would
choose the host a prefill engine connects to. Errors, the client's or an engine's, are
OpenAI-style: `{"error": {"message", "type", "param", "code"}}` with an HTTP status (`ApiError`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any
from urllib.parse import urlsplit

from starlette.responses import JSONResponse

# Body fields that belong to Boomerang or to the P/D handshake, never forwarded as sent.
# (`prompt_cache_key` is OpenAI's and is forwarded: vLLM 0.33.0's request models allow
# extra fields and ignore it.)
BOOMERANG_FIELDS = ("conversation_id",)
DROPPED_FIELDS = ("kv_transfer_params",)
CONVERSATION_HEADER = "x-conversation-id"
SESSION_HEADER = "x-session-id"
# Where a request names its conversation, in order of precedence: the first given wins, and
# any other given with a different value is a 400 (a client that sends two names for its
# conversation has a bug worth hearing about, not a silent choice).
CONVERSATION_SOURCES = ("conversation_id", "X-Conversation-Id", "prompt_cache_key", "X-Session-Id")
# `X-Boomerang-Reuse: off` serves the turn as plain prefill→decode with no tokenize, plan or
# report: the "feature off" baseline of `boomerang demo` and `boomerang replay --mode off`.
REUSE_HEADER = "x-boomerang-reuse"
MAX_CONVERSATION_ID = 256
# Chat fields that change how /tokenize renders the prompt; sent along so the count matches.
_TEMPLATE_FIELDS = (
    "tools",
    "chat_template",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "documents",
)

# The `type` OpenAI uses for each status.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


class ApiError(Exception):
    """An error to return to the client as OpenAI-style JSON."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type_: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_ or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")

    def body(self) -> dict[str, Any]:
        """The JSON body."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        """The HTTP response."""
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def engine_status(status: int) -> int:
    """The status to give the client for an engine's error status.

    Client errors pass through (the engine judged the request: too long, bad sampling
    parameters); an engine's own failure is the gateway's upstream failure, 502.
    """
    if 400 <= status < 500 and status not in (401, 403, 407, 408):
        return status
    if status in (503, 504):
        return status
    return 502


def from_engine(role: str, status: int, raw: bytes) -> ApiError:
    """An engine's error response, normalized to the OpenAI shape with the right status."""
    message, param, code, type_ = "", None, None, None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        data = None
    if isinstance(data, dict):
        err: dict[str, Any] = data["error"] if isinstance(data.get("error"), dict) else data
        message = str(err.get("message") or "")
        param = err.get("param") if isinstance(err.get("param"), str) else None
        code = str(err["code"]) if err.get("code") is not None else None
        type_ = err.get("type") if isinstance(err.get("type"), str) else None
    if not message:
        message = raw[:500].decode("utf-8", "replace").strip() or f"HTTP {status}"
    out = engine_status(status)
    if out != status:
        message = f"{role} engine failed (HTTP {status}): {message}"
        type_, code = "upstream_error", code or str(status)
    return ApiError(out, message, param=param, code=code, type_=type_)


class Kind(str, Enum):
    """Which OpenAI endpoint."""

    CHAT = "chat"
    COMPLETION = "completion"

    @property
    def path(self) -> str:
        """The engine path."""
        return "/v1/chat/completions" if self is Kind.CHAT else "/v1/completions"


@dataclass
class ClientRequest:
    """A validated client request."""

    kind: Kind
    model: str
    body: dict[str, Any]  # what may be forwarded: Boomerang's fields removed
    stream: bool
    include_usage: bool
    wants_token_ids: bool
    conversation_id: str
    dropped_kv_params: bool = False
    prompt_token_ids: list[int] | None = None  # completions given token ids
    reuse: bool = True
    # vLLM's isolation key, forwarded to the engines as sent; it also seeds the plan's chain,
    # so a turn never reuses a lease of another salt, as vLLM never shares prefix cache across salts.
    cache_salt: str = ""


def _conversation_id(value: Any, source: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ApiError(400, f"{source} must be a string", param=source)
    cleaned: str = value.strip()
    if len(cleaned) > MAX_CONVERSATION_ID or not cleaned.isprintable():
        raise ApiError(400, f"{source} must be at most {MAX_CONVERSATION_ID} printable characters", param=source)
    return cleaned


def conversation_of(body: dict[str, Any], headers: Mapping[str, str | None]) -> str:
    """The request's conversation id from `CONVERSATION_SOURCES`; ApiError(400) on conflict."""
    given = {
        "conversation_id": body.get("conversation_id"),
        "X-Conversation-Id": headers.get(CONVERSATION_HEADER),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "X-Session-Id": headers.get(SESSION_HEADER),
    }
    found: list[tuple[str, str]] = []
    for source in CONVERSATION_SOURCES:
        value = _conversation_id(given[source], source)
        if value:
            found.append((source, value))
    if not found:
        return ""
    (first, value), *rest = found
    for source, other in rest:
        if other != value:
            raise ApiError(
                400,
                f"{first} ({value!r}) and {source} ({other!r}) name different conversations; "
                "send one, or the same value in both",
                param=source,
            )
    return value


def _token_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)


def _completion_prompt(prompt: Any) -> list[int] | None:
    """Token ids when the prompt is given as ids; None for text; ApiError for batches."""
    if isinstance(prompt, list) and len(prompt) == 1 and (isinstance(prompt[0], str) or _token_list(prompt[0])):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise ApiError(400, "prompt must not be empty", param="prompt")
        return None
    if _token_list(prompt) and prompt:
        return list(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise ApiError(400, "batched prompts are not supported; send one prompt per request", param="prompt")
    raise ApiError(400, "prompt must be a string or a list of token ids", param="prompt")


def parse(
    kind: Kind,
    raw: bytes,
    conversation_header: str | None,
    reuse_header: str | None = None,
    session_header: str | None = None,
) -> ClientRequest:
    """Validate a client body; ApiError(400) names the field at fault."""
    reuse = (reuse_header or "on").strip().lower()
    if reuse not in ("on", "off"):
        raise ApiError(400, "X-Boomerang-Reuse must be on or off", param="X-Boomerang-Reuse")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "model is required and must be a string", param="model")
    prompt_ids = None
    if kind is Kind.CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise ApiError(400, "messages must be a non-empty list of message objects", param="messages")
    else:
        if "prompt" not in body:
            raise ApiError(400, "prompt is required", param="prompt")
        prompt_ids = _completion_prompt(body["prompt"])
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise ApiError(400, "stream must be true or false", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", param="stream_options")
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise ApiError(400, "n must be 1: disaggregated prefill/decode serves one choice per request", param="n")
    wants_ids = body.get("return_token_ids", False)
    if not isinstance(wants_ids, (bool, type(None))):
        raise ApiError(400, "return_token_ids must be true or false", param="return_token_ids")
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        # vLLM refuses it too; refused here, before any plan is made for it.
        raise ApiError(400, "cache_salt must be a non-empty string if given", param="cache_salt")
    conversation = conversation_of(body, {CONVERSATION_HEADER: conversation_header, SESSION_HEADER: session_header})
    forward = {k: v for k, v in body.items() if k not in BOOMERANG_FIELDS and k not in DROPPED_FIELDS}
    return ClientRequest(
        kind=kind,
        model=model,
        body=forward,
        stream=stream,
        include_usage=bool(options and options.get("include_usage")),
        wants_token_ids=bool(wants_ids),
        conversation_id=conversation,
        dropped_kv_params="kv_transfer_params" in body,
        prompt_token_ids=prompt_ids,
        reuse=reuse == "on",
        cache_salt=salt or "",
    )


# Roles a chat's first turn may hold: nothing the model wrote (an assistant message, or a tool
# result answering one).
FIRST_TURN_ROLES = frozenset({"system", "developer", "user"})


def is_first_turn(req: ClientRequest) -> bool:
    """Whether the request is a chat whose messages hold no earlier output of the model."""
    return req.kind is Kind.CHAT and all(m.get("role") in FIRST_TURN_ROLES for m in req.body["messages"])


def tokenize_body(req: ClientRequest) -> dict[str, Any]:
    """The `/tokenize` request that renders the prompt as the prefill engine will."""
    if req.kind is Kind.CHAT:
        out: dict[str, Any] = {"model": req.model, "messages": req.body["messages"], "add_generation_prompt": True}
        for key in _TEMPLATE_FIELDS:
            if key in req.body:
                out[key] = req.body[key]
        return out
    prompt = req.body["prompt"]
    if isinstance(prompt, list):
        prompt = prompt[0]
    out = {"model": req.model, "prompt": prompt}
    if "add_special_tokens" in req.body:
        out["add_special_tokens"] = req.body["add_special_tokens"]
    return out


def prefill_body(req: ClientRequest, kv_transfer_params: dict[str, Any]) -> dict[str, Any]:
    """The prefill request: one token, not streamed, with the plan's `kv_transfer_params`."""
    body = copy.deepcopy(req.body)
    body["max_tokens"] = 1
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    body["stream"] = False
    for key in ("stream_options", "min_tokens", "return_token_ids"):
        body.pop(key, None)
    body["kv_transfer_params"] = kv_transfer_params
    return body


def decode_body(req: ClientRequest, kv_transfer_params: dict[str, Any] | None) -> dict[str, Any]:
    """The decode request: streamed with token ids and usage, with the prefill's params."""
    body = copy.deepcopy(req.body)
    body["stream"] = True
    options = dict(body.get("stream_options") or {})
    options["include_usage"] = True
    body["stream_options"] = options
    body["return_token_ids"] = True
    if kv_transfer_params is not None:
        body["kv_transfer_params"] = kv_transfer_params
    return body


def rewrite_remote_host(params: dict[str, Any] | None, engine_url: str) -> dict[str, Any] | None:
    """`params` with `remote_host` set to the host the gateway reached the engine at.

    An engine reports its side channel as it sees itself (often a pod-local or wildcard
    address); vLLM's proxy rewrites it to the address it reached the engine at, and so does
    the gateway.
    """
    if not params or not params.get("remote_host"):
        return params
    host = urlsplit(engine_url).hostname  # an IPv6 literal without its brackets
    if not host:
        return params
    out = dict(params)
    out["remote_host"] = host
    return out
