"""Request validation: protobuf requests in, validated values out (or INVALID_ARGUMENT).

Every problem of a request is reported at once, each naming its field. Nothing here
touches the network or the database.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from boomerang import chainproto
from boomerang.errors import BoomerangError, Violations
from boomerang.tokenchain import TokenChain
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import types_pb2 as tpb
from boomerang_server.validation import MAX_TEXT, check_conversation, check_id, check_text

from boomerang_router import kvparams
from boomerang_router.domain import HandleUse
from boomerang_router.kvparams import KvParams
from boomerang_router.listing import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    ListInput,
    PageTokenError,
    decode_page_token,
)
from boomerang_router.plan_store import plan_time

MAX_SALT = 256


_HANDLE_USE = {
    rtpb.HANDLE_USE_UNSPECIFIED: HandleUse.UNKNOWN,
    rtpb.HANDLE_USE_READ: HandleUse.READ,
    rtpb.HANDLE_USE_NOT_READ: HandleUse.NOT_READ,
    rtpb.HANDLE_USE_UNKNOWN: HandleUse.UNKNOWN,
}


def check_plan_id(v: Violations, path: str, value: str) -> datetime | None:
    """A plan id (UUIDv7); returns the creation time it carries."""
    if not value:
        v.add(path, "is required")
        return None
    try:
        return plan_time(value)
    except ValueError:
        v.add(path, "must be a plan id (a UUIDv7) returned by PlanTurn")
        return None


@dataclass(frozen=True)
class PlanInput:
    """A validated PlanTurn request."""

    tenant: str
    conversation_id: str
    model: str
    token_ids: list[int] | None
    chain: TokenChain | None
    prompt_tokens: int
    request_id: str
    salt: str = ""  # vLLM's cache_salt: chains of two salts never match
    prefill_cached: int = 0  # prompt tokens the prefill engine's own cache holds
    can_prefill_on_decode: bool = False
    prefill_engine_id: str = ""  # the caller's own prefill engine (the vLLM hook's)
    turn_started: bool = False  # the caller went on without this plan: it claims nothing


# The longest a reported prefill, copy or inter-token gap may be (seconds).
MAX_REPORTED_SECONDS = 600.0


def plan_turn(req: rtpb.PlanTurnRequest, max_prompt_tokens: int) -> PlanInput:
    """Validate PlanTurnRequest."""
    v = Violations()
    check_id(v, "tenant", req.tenant)
    # Optional: a plan without one is found by the prompt it continues.
    check_conversation(v, "conversation_id", req.conversation_id, required=False)
    check_id(v, "model", req.model, MAX_TEXT)
    check_id(v, "request_id", req.request_id, required=False)
    check_text(v, "cache_salt", req.cache_salt, MAX_SALT, required=False)
    has_ids, has_chain = len(req.prompt_token_ids) > 0, req.HasField("prompt_chain")
    chain = None
    length = 0
    if has_ids and has_chain:
        v.add("prompt_chain", "give prompt_token_ids or prompt_chain, not both")
    elif has_ids:
        length = len(req.prompt_token_ids)
    elif has_chain:
        chain = chainproto.validated(v, "prompt_chain", req.prompt_chain)
        length = chain.num_tokens if chain is not None else 0
        if chain is not None and length == 0:
            v.add("prompt_chain.num_tokens", "must be at least 1")
    else:
        v.add("prompt_token_ids", "is required (or give prompt_chain)")
    if length > max_prompt_tokens:
        v.add("prompt_token_ids" if has_ids else "prompt_chain.num_tokens", f"at most {max_prompt_tokens} tokens are accepted")
    if req.num_prompt_tokens < 0:
        v.add("num_prompt_tokens", "must be non-negative")
    elif req.num_prompt_tokens and length and req.num_prompt_tokens != length:
        v.add("num_prompt_tokens", f"is {req.num_prompt_tokens} but the prompt has {length} tokens")
    if not 0 <= req.prefill_cached_tokens <= max(length, 0):
        v.add("prefill_cached_tokens", f"must be 0 to the prompt's length ({length})")
    check_id(v, "prefill_engine_id", req.prefill_engine_id, MAX_TEXT, required=False)
    v.raise_if_any()
    return PlanInput(
        tenant=req.tenant,
        conversation_id=req.conversation_id,
        model=req.model,
        token_ids=list(req.prompt_token_ids) if has_ids else None,
        chain=chain,
        prompt_tokens=length,
        request_id=req.request_id,
        salt=req.cache_salt,
        prefill_cached=req.prefill_cached_tokens,
        can_prefill_on_decode=req.can_prefill_on_decode,
        prefill_engine_id=req.prefill_engine_id,
        turn_started=req.turn_started,
    )


@dataclass(frozen=True)
class ReportInput:
    """A validated ReportTurn request."""

    tenant: str
    plan_id: str
    created_at: datetime
    handle_use: HandleUse
    decode_params: KvParams | None
    token_ids: list[int] | None  # prompt then output
    chain: TokenChain | None
    finish_time_unix: float
    conversation_id: str
    delivered_cached_tokens: int | None = None  # the prefill engine's own count, if it gave one
    prompt_len: int = 0  # how many of `token_ids` are the prompt (the rest are output)
    salt: str = ""  # the request's cache_salt, as given to PlanTurn
    prefill_seconds: float | None = None  # measured by the caller
    copy_seconds: float | None = None
    inter_token_seconds: float | None = None
    decode_first_token_seconds: float | None = None


def _seconds(v: Violations, req: rtpb.ReportTurnRequest, name: str) -> float | None:
    """An optional measured duration: None when unset, else 0 to MAX_REPORTED_SECONDS."""
    if not req.HasField(name):
        return None
    value = float(getattr(req, name))
    if not (math.isfinite(value) and 0 <= value <= MAX_REPORTED_SECONDS):
        v.add(name, f"must be 0 to {MAX_REPORTED_SECONDS:.0f} seconds")
        return None
    return value


def params_from_proto(msg: tpb.KvTransferParams) -> KvParams:
    """The typed `kv_transfer_params` message as KvParams (each optional field under its name)."""
    groups = tuple(tuple(g.block_ids) for g in msg.remote_block_groups)
    scalars: dict[str, Any] = {
        name: getattr(msg, name) if msg.HasField(name) else None for name in kvparams.SCALAR_KEYS
    }
    return KvParams(
        do_remote_decode=msg.do_remote_decode,
        do_remote_prefill=msg.do_remote_prefill,
        remote_block_ids=groups or None,
        **scalars,
    )


def _offers_blocks(p: KvParams) -> bool:
    """Whether D's params offer retained blocks (then they must be a complete handle)."""
    return bool(p.do_remote_decode and p.remote_block_ids and any(p.remote_block_ids))


def _check_handle(v: Violations, path: str, p: KvParams) -> None:
    """A decode handle that offers blocks must carry everything P will need."""
    if not _offers_blocks(p):
        return  # D retained nothing reusable: nothing to check
    for name in ("remote_engine_id", "remote_request_id", "remote_host"):
        value = getattr(p, name)
        if not value:
            v.add(f"{path}.{name}", "is required with remote_block_ids")
        elif len(value) > (255 if name == "remote_host" else MAX_TEXT):
            v.add(f"{path}.{name}", "is too long")
    if p.remote_port is None or not 1 <= p.remote_port <= 65535:
        v.add(f"{path}.remote_port", "must be 1 to 65535 with remote_block_ids")
    if p.remote_num_tokens is None or p.remote_num_tokens < 1:
        v.add(f"{path}.remote_num_tokens", "must be at least 1 with remote_block_ids")
    groups = p.remote_block_ids or ()
    if any(b < 0 or b > 2**31 - 1 for g in groups for b in g):
        v.add(f"{path}.remote_block_ids", "block ids must be 0 to 2147483647")
    if any(not g for g in groups):
        v.add(f"{path}.remote_block_ids", "every KV-cache group must hold at least one block id")
    for name in ("tp_size", "dcp_size", "pp_size"):
        value = getattr(p, name)
        if value is not None and not 1 <= value <= 4096:
            v.add(f"{path}.{name}", "must be 1 to 4096")
    if p.remote_registration_generation is not None and p.remote_registration_generation < 0:
        v.add(f"{path}.remote_registration_generation", "must be non-negative")


def report_turn(req: rtpb.ReportTurnRequest, max_tokens: int) -> ReportInput:
    """Validate ReportTurnRequest."""
    v = Violations()
    check_id(v, "tenant", req.tenant)
    created = check_plan_id(v, "plan_id", req.plan_id)
    check_conversation(v, "conversation_id", req.conversation_id, required=False)
    check_id(v, "request_id", req.request_id, required=False)
    if req.handle_use not in _HANDLE_USE:
        v.add("handle_use", "is not a HandleUse")
    params: KvParams | None = None
    has_typed, has_json = req.HasField("decode_kv_transfer_params"), bool(req.decode_kv_transfer_params_json)
    if has_typed and has_json:
        v.add("decode_kv_transfer_params_json", "give decode_kv_transfer_params or its JSON, not both")
    elif has_typed:
        params = params_from_proto(req.decode_kv_transfer_params)
        _check_handle(v, "decode_kv_transfer_params", params)
    elif has_json:
        try:
            params = kvparams.from_json(req.decode_kv_transfer_params_json)
        except ValueError as exc:
            v.add("decode_kv_transfer_params_json", str(exc))
        if params is not None:
            _check_handle(v, "decode_kv_transfer_params_json", params)
    token_ids: list[int] | None = None
    chain: TokenChain | None = None
    if req.prompt_token_ids or req.output_token_ids:
        token_ids = [*req.prompt_token_ids, *req.output_token_ids]
        if req.HasField("sequence_chain"):
            v.add("sequence_chain", "give token ids or sequence_chain, not both")
        if len(token_ids) > max_tokens:
            v.add("prompt_token_ids", f"prompt plus output may hold at most {max_tokens} tokens")
    elif req.HasField("sequence_chain"):
        chain = chainproto.validated(v, "sequence_chain", req.sequence_chain)
        if (chain is not None and params is not None and params.remote_num_tokens is not None
                and chain.num_tokens > params.remote_num_tokens):
            v.add("sequence_chain.num_tokens", "must not exceed the handle's remote_num_tokens")
        if chain is not None and chain.num_tokens == 0:
            v.add("sequence_chain.num_tokens", "must be at least 1")
    if params is not None and _offers_blocks(params) and token_ids is None and chain is None:
        v.add("prompt_token_ids", "is required with a reusable decode handle (or give sequence_chain)")
    if req.finish_time_unix and not (math.isfinite(req.finish_time_unix) and 0 < req.finish_time_unix < 32503680000):
        v.add("finish_time_unix", "must be seconds since the Unix epoch")
    check_text(v, "cache_salt", req.cache_salt, MAX_SALT, required=False)
    delivered = req.delivered_cached_tokens if req.HasField("delivered_cached_tokens") else None
    if delivered is not None and not 0 <= delivered <= max_tokens:
        v.add("delivered_cached_tokens", f"must be 0 to {max_tokens} (a prompt's length at most)")
    prefill_seconds = _seconds(v, req, "prefill_seconds")
    copy_seconds = _seconds(v, req, "copy_seconds")
    if copy_seconds is not None and (prefill_seconds is None or copy_seconds > prefill_seconds):
        v.add("copy_seconds", "must come with prefill_seconds and be at most it")
    inter_token_seconds = _seconds(v, req, "inter_token_seconds")
    decode_first_token_seconds = _seconds(v, req, "decode_first_token_seconds")
    v.raise_if_any()
    assert created is not None
    return ReportInput(
        tenant=req.tenant,
        plan_id=req.plan_id,
        created_at=created,
        handle_use=_HANDLE_USE[req.handle_use],
        decode_params=params,
        token_ids=token_ids,
        chain=chain,
        finish_time_unix=req.finish_time_unix,
        conversation_id=req.conversation_id,
        delivered_cached_tokens=delivered,
        prompt_len=len(req.prompt_token_ids),
        salt=req.cache_salt,
        prefill_seconds=prefill_seconds,
        copy_seconds=copy_seconds,
        inter_token_seconds=inter_token_seconds,
        decode_first_token_seconds=decode_first_token_seconds,
    )


MAX_REPORT_BATCH = 256  # ReportTurnBatch's limit, as the proto states


def report_batch(req: rtpb.ReportTurnBatchRequest, max_tokens: int) -> list[ReportInput | BoomerangError]:
    """Validate ReportTurnBatchRequest: 1 to MAX_REPORT_BATCH reports, or the whole call is
    INVALID_ARGUMENT; each report as ReportTurn validates it, a bad one being its own error
    (in its place) that leaves the others alone."""
    v = Violations()
    v.require(
        1 <= len(req.reports) <= MAX_REPORT_BATCH, "reports",
        f"must hold 1 to {MAX_REPORT_BATCH} reports (got {len(req.reports)}); send more as further calls",
    )
    v.raise_if_any()
    out: list[ReportInput | BoomerangError] = []
    for item in req.reports:
        try:
            out.append(report_turn(item, max_tokens))
        except BoomerangError as err:
            out.append(err)
    return out


def get_plan(req: rtpb.GetTurnPlanRequest) -> datetime:
    """Validate GetTurnPlanRequest; returns the plan's creation time."""
    v = Violations()
    check_id(v, "tenant", req.tenant)
    created = check_plan_id(v, "plan_id", req.plan_id)
    v.raise_if_any()
    assert created is not None
    return created


def list_plans(req: rtpb.ListTurnPlansRequest) -> ListInput:
    """Validate ListTurnPlansRequest (a token is checked against the listing it names)."""
    v = Violations()
    check_id(v, "tenant", req.tenant)
    check_conversation(v, "conversation_id", req.conversation_id, required=True)
    named = not v.items  # a token names its listing: judge it only against a valid one
    v.require(0 <= req.page_size <= MAX_PAGE_SIZE, "page_size", f"must be 0 (default {DEFAULT_PAGE_SIZE}) to {MAX_PAGE_SIZE}")
    after = ""
    if req.page_token and named:
        try:
            after = decode_page_token(req.page_token, req.tenant, req.conversation_id)
        except PageTokenError as exc:
            v.add("page_token", str(exc))
    v.raise_if_any()
    return ListInput(req.tenant, req.conversation_id, req.page_size or DEFAULT_PAGE_SIZE, after)


def list_engines(req: rtpb.RouterServiceListEnginesRequest) -> None:
    """Validate RouterServiceListEnginesRequest."""
    v = Violations()
    v.require(len(req.model) <= MAX_TEXT, "model", f"must be at most {MAX_TEXT} characters")
    v.require(
        req.role in (tpb.ENGINE_ROLE_UNSPECIFIED, tpb.ENGINE_ROLE_PREFILL, tpb.ENGINE_ROLE_DECODE),
        "role",
        "is not an EngineRole",
    )
    v.raise_if_any()
