"""The registry's wire: protobuf requests validated into the values the stores take (or
INVALID_ARGUMENT), and the stores' rows written as protobuf messages.

Every problem of a request is reported at once, each naming its field, so a caller can fix
everything in one go. Nothing here touches the database.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from boomerang import chainproto
from boomerang.errors import BoomerangError, Violations
from boomerang.tokenchain import TokenChain, pack_tokens
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb
from boomerang_server.rpc.server import ts as ts  # as `wire.ts` too
from boomerang_server.validation import MAX_TEXT, check_conversation, check_id, check_text

MAX_BLOCK_ID = 2**31 - 1


@dataclass(frozen=True)
class EngineSpec:
    """A validated engine registration."""

    engine_id: str
    role: str  # PREFILL or DECODE
    model: str
    side_channel_host: str
    side_channel_port: int
    http_base_url: str
    generation: int
    kv_blocks_ttl_seconds: int
    block_size: int
    tp_size: int
    dcp_size: int
    pp_size: int
    bytes_per_block: int
    kv_recompute_threshold: int


@dataclass(frozen=True)
class RetainedBlocks:
    """A validated registration of a finished turn's retained blocks."""

    tenant: str
    conversation_id: str
    engine_id: str
    engine_generation: int
    remote_request_id: str
    block_groups: list[list[int]]
    num_tokens: int
    chain: TokenChain
    finish_time: datetime | None
    remote_host: str
    remote_port: int
    model: str
    request_id: str
    prompt_tokens: int = 0  # the previous prompt's length; 0: found by conversation id only
    prompt_tail_ids: tuple[int, ...] = ()  # its partial last block's token ids

    @property
    def num_blocks(self) -> int:
        """Block ids over all groups."""
        return sum(len(group) for group in self.block_groups)


@dataclass(frozen=True)
class ClaimQuery:
    """A validated claim request."""

    tenant: str
    conversation_id: str
    chain: TokenChain
    min_reusable_tokens: int
    min_remaining_seconds: float
    claim_id: str
    model: str
    prompt_packed: bytes = b""  # without a conversation id: the new prompt, packed u32 LE


@dataclass(frozen=True)
class ClaimSettlement:
    """A claimed lease to settle: consumed (`read`) or given back to the conversation."""

    tenant: str
    lease_id: str
    claim_id: str
    read: bool
    reason: str = "PREFILL_DID_NOT_READ"  # the release's audit reason, when not read


@dataclass(frozen=True)
class TurnEnd:
    """One turn's end: either part may be absent (a turn that pulled nothing, or kept nothing)."""

    claim: ClaimSettlement | None = None
    registration: RetainedBlocks | None = None


def check_lease_id(v: Violations, path: str, value: str) -> None:
    """A lease id: a UUID, as this registry hands them out."""
    try:
        uuid.UUID(value)
    except ValueError:
        v.add(path, "must be a lease id (a UUID) returned by this registry")


def chain_from_proto(v: Violations, path: str, msg: tpb.TokenChain, present: bool) -> TokenChain | None:
    """A validated token chain, or None after recording why not."""
    if not present:
        v.add(path, "is required")
        return None
    return chainproto.validated(v, path, msg)


def engine_spec(req: rpb.RegisterEngineRequest, default_ttl: int) -> EngineSpec:
    """Validate RegisterEngineRequest."""
    v = Violations()
    e = req.engine
    if not req.HasField("engine"):
        v.add("engine", "is required")
        v.raise_if_any()
    check_id(v, "engine.engine_id", e.engine_id)
    v.require(e.role in (tpb.ENGINE_ROLE_PREFILL, tpb.ENGINE_ROLE_DECODE),
              "engine.role", "must be ENGINE_ROLE_PREFILL or ENGINE_ROLE_DECODE")
    check_id(v, "engine.model", e.model, MAX_TEXT)
    check_text(v, "engine.side_channel_host", e.side_channel_host, 255)
    v.require(0 <= e.side_channel_port <= 65535, "engine.side_channel_port", "must be 0 to 65535")
    check_text(v, "engine.http_base_url", e.http_base_url)
    if e.http_base_url and not v.items:
        v.require(e.http_base_url.startswith(("http://", "https://")), "engine.http_base_url", "must start with http:// or https://")
    v.require(e.registration_generation >= 0, "engine.registration_generation", "must be non-negative")
    v.require(0 <= e.kv_blocks_ttl_seconds <= 86400, "engine.kv_blocks_ttl_seconds", "must be 0 (default 480) to 86400 seconds")
    v.require(0 <= e.block_size <= 1024, "engine.block_size", "must be 0 (default 16) to 1024")
    for name in ("tp_size", "dcp_size", "pp_size"):
        v.require(0 <= getattr(e, name) <= 4096, f"engine.{name}", "must be 0 (default 1) to 4096")
    v.require(e.bytes_per_block >= 0, "engine.bytes_per_block", "must be non-negative")
    v.require(0 <= e.kv_recompute_threshold <= 1_000_000, "engine.kv_recompute_threshold", "must be 0 (default 64) to 1000000")
    if e.role == tpb.ENGINE_ROLE_DECODE:
        v.require(bool(e.side_channel_host) and e.side_channel_port > 0, "engine.side_channel_host",
                  "a decode engine needs its NIXL side-channel host and port")
    check_id(v, "request_id", req.request_id, required=False)
    v.raise_if_any()
    return EngineSpec(
        engine_id=e.engine_id,
        role="PREFILL" if e.role == tpb.ENGINE_ROLE_PREFILL else "DECODE",
        model=e.model,
        side_channel_host=e.side_channel_host,
        side_channel_port=e.side_channel_port,
        http_base_url=e.http_base_url,
        generation=e.registration_generation,
        kv_blocks_ttl_seconds=e.kv_blocks_ttl_seconds or default_ttl,
        block_size=e.block_size or 16,
        tp_size=e.tp_size or 1,
        dcp_size=e.dcp_size or 1,
        pp_size=e.pp_size or 1,
        bytes_per_block=e.bytes_per_block,
        kv_recompute_threshold=e.kv_recompute_threshold or 64,
    )


def heartbeat(req: rpb.HeartbeatRequest) -> None:
    """Validate HeartbeatRequest."""
    v = Violations()
    check_id(v, "engine_id", req.engine_id)
    v.require(req.registration_generation >= 0, "registration_generation", "must be non-negative")
    v.require(req.in_flight_requests >= 0, "in_flight_requests", "must be non-negative")
    v.require(req.queued_prompt_tokens >= 0, "queued_prompt_tokens", "must be non-negative")
    v.require(req.free_kv_blocks >= 0, "free_kv_blocks", "must be non-negative")
    v.require(req.total_kv_blocks >= 0, "total_kv_blocks", "must be non-negative")
    v.require(
        req.total_kv_blocks == 0 or req.free_kv_blocks <= req.total_kv_blocks, "free_kv_blocks",
        "must not exceed total_kv_blocks",
    )
    v.raise_if_any()


def retained_blocks(req: rpb.RegisterRetainedBlocksRequest, max_blocks: int, max_tokens: int) -> RetainedBlocks:
    """Validate RegisterRetainedBlocksRequest."""
    v = Violations()
    check_id(v, "tenant", req.tenant)
    check_conversation(v, "conversation_id", req.conversation_id, required=False)
    check_id(v, "engine_id", req.engine_id)
    v.require(req.engine_generation >= 0, "engine_generation", "must be non-negative")
    check_id(v, "remote_request_id", req.remote_request_id, MAX_TEXT)
    groups = [list(g.block_ids) for g in req.block_groups]
    total = sum(len(g) for g in groups)
    if not groups:
        v.add("block_groups", "needs at least one KV-cache group of block ids")
    elif any(not g for g in groups):
        v.add("block_groups", "every KV-cache group must hold at least one block id")
    elif total > max_blocks:
        v.add("block_groups", f"holds {total} block ids; at most {max_blocks} are accepted")
    elif any(b < 0 or b > MAX_BLOCK_ID for g in groups for b in g):
        v.add("block_groups", f"block ids must be 0 to {MAX_BLOCK_ID}")
    v.require(0 < req.num_tokens <= max_tokens, "num_tokens", f"must be 1 to {max_tokens}")
    chain = chain_from_proto(v, "token_chain", req.token_chain, req.HasField("token_chain"))
    if chain is not None and chain.num_tokens != req.num_tokens:
        v.add("token_chain.num_tokens", f"is {chain.num_tokens} but num_tokens is {req.num_tokens}")
    finish = None
    if req.finish_time_unix:
        if not 0 < req.finish_time_unix < 32503680000:
            v.add("finish_time_unix", "must be seconds since the Unix epoch")
        else:
            finish = datetime.fromtimestamp(req.finish_time_unix, tz=UTC)
    check_text(v, "remote_host", req.remote_host, 255)
    v.require(0 <= req.remote_port <= 65535, "remote_port", "must be 0 to 65535")
    check_text(v, "model", req.model)
    check_id(v, "request_id", req.request_id, required=False)
    if chain is not None:
        _check_prompt_end(v, req, chain)
    v.raise_if_any()
    assert chain is not None
    return RetainedBlocks(
        tenant=req.tenant,
        conversation_id=req.conversation_id,
        engine_id=req.engine_id,
        engine_generation=req.engine_generation,
        remote_request_id=req.remote_request_id,
        block_groups=groups,
        num_tokens=req.num_tokens,
        chain=chain,
        finish_time=finish,
        remote_host=req.remote_host,
        remote_port=req.remote_port,
        model=req.model,
        request_id=req.request_id,
        prompt_tokens=req.prompt_tokens,
        prompt_tail_ids=tuple(req.prompt_tail_token_ids),
    )


def _check_prompt_end(v: Violations, req: rpb.RegisterRetainedBlocksRequest, chain: TokenChain) -> None:
    """The previous prompt (`prompt_tokens` and its partial block's ids) fits the chain."""
    if not 0 <= req.prompt_tokens <= req.num_tokens:
        v.add("prompt_tokens", f"must be 0 to num_tokens ({req.num_tokens})")
        return
    tail = req.prompt_tokens % chain.block_size if req.prompt_tokens else 0
    if len(req.prompt_tail_token_ids) != tail:
        v.add("prompt_tail_token_ids", f"must hold the prompt's last {tail} token ids (prompt_tokens % block_size)")


def claim(req: rpb.ClaimReuseRequest) -> ClaimQuery:
    """Validate ClaimReuseRequest."""
    v = Violations()
    check_id(v, "tenant", req.tenant)
    check_conversation(v, "conversation_id", req.conversation_id, required=False)
    chain = chain_from_proto(v, "prompt_chain", req.prompt_chain, req.HasField("prompt_chain"))
    packed = b""
    if not req.conversation_id and chain is not None:
        if len(req.prompt_token_ids) != chain.num_tokens:
            v.add("prompt_token_ids", f"must hold the prompt's {chain.num_tokens} token ids without a conversation_id")
        else:
            packed = pack_tokens(req.prompt_token_ids)
    v.require(req.min_reusable_tokens >= 0, "min_reusable_tokens", "must be non-negative")
    v.require(0 <= req.min_remaining_seconds <= 86400, "min_remaining_seconds", "must be 0 to 86400 seconds")
    check_id(v, "claim_id", req.claim_id)
    check_text(v, "model", req.model)
    v.raise_if_any()
    assert chain is not None
    return ClaimQuery(
        tenant=req.tenant,
        conversation_id=req.conversation_id,
        chain=chain,
        min_reusable_tokens=max(1, req.min_reusable_tokens),
        min_remaining_seconds=req.min_remaining_seconds if req.min_remaining_seconds else 5.0,
        claim_id=req.claim_id,
        model=req.model,
        prompt_packed=packed,
    )


MAX_BATCH = 256  # claims per ClaimReuseBatch, registrations per RegisterRetainedBlocksBatch


def batch_size(field: str, n: int) -> None:
    """A batch request holds 1 to MAX_BATCH items in `field` (each is validated alone)."""
    v = Violations()
    v.require(1 <= n <= MAX_BATCH, field, f"must hold 1 to {MAX_BATCH} {field}")
    v.raise_if_any()


_CLAIM_USES = (rpb.CLAIM_USE_READ, rpb.CLAIM_USE_NOT_READ)


def turn_end(req: rpb.CompleteTurnRequest, max_blocks: int, max_tokens: int) -> TurnEnd:
    """Validate CompleteTurnRequest (the registration as RegisterRetainedBlocks validates it,
    its fields named under `registration.`)."""
    v = Violations()
    check_id(v, "tenant", req.tenant)
    has_claim, has_registration = req.HasField("claim"), req.HasField("registration")
    v.require(has_claim or has_registration, "claim", "is required when there is no registration (nothing to do)")
    claim = None
    if has_claim:
        c = req.claim
        check_lease_id(v, "claim.lease_id", c.lease_id)
        check_id(v, "claim.claim_id", c.claim_id)
        v.require(c.use in _CLAIM_USES, "claim.use", "must be CLAIM_USE_READ or CLAIM_USE_NOT_READ")
        check_text(v, "claim.release_reason", c.release_reason, 128)
        claim = ClaimSettlement(
            req.tenant, c.lease_id, c.claim_id, c.use == rpb.CLAIM_USE_READ, c.release_reason or "PREFILL_DID_NOT_READ"
        )
    registration = None
    if has_registration:
        reg = req.registration
        v.require(reg.tenant in ("", req.tenant), "registration.tenant", "must be empty or equal tenant")
        if not reg.tenant:
            reg = rpb.RegisterRetainedBlocksRequest()
            reg.CopyFrom(req.registration)
            reg.tenant = req.tenant
        try:
            registration = retained_blocks(reg, max_blocks, max_tokens)
        except BoomerangError as err:
            for f in err.violations:
                if f.field != "tenant":  # reported once, as `tenant`
                    v.add(f"registration.{f.field}", f.description)
    v.raise_if_any()
    return TurnEnd(claim, registration)


# Rows to messages.

_ROLE = {"PREFILL": tpb.ENGINE_ROLE_PREFILL, "DECODE": tpb.ENGINE_ROLE_DECODE}
ROLE_NAME = {v: k for k, v in _ROLE.items()}
_STATUS = {"ACTIVE": tpb.ENGINE_STATUS_ACTIVE, "DEAD": tpb.ENGINE_STATUS_DEAD}
LEASE_STATE = {n.removeprefix("LEASE_STATE_"): v for n, v in tpb.LeaseState.items() if v}
LEASE_STATE_NAME = {v: k for k, v in LEASE_STATE.items()}


# The columns a message carries under the same name and form.
_ENGINE_FIELDS = (
    "engine_id", "model", "side_channel_host", "side_channel_port", "http_base_url",
    "kv_blocks_ttl_seconds", "block_size", "tp_size", "dcp_size", "pp_size", "bytes_per_block",
    "kv_recompute_threshold", "in_flight_requests", "queued_prompt_tokens",
)
_LEASE_FIELDS = (
    "lease_id", "tenant", "conversation_id", "engine_id", "engine_generation", "remote_request_id",
    "num_tokens", "block_size", "version", "remote_host", "remote_port", "tp_size", "dcp_size",
    "pp_size", "model",
)


def engine(row: Mapping[str, Any]) -> tpb.Engine:
    """An Engine message from an engines row."""
    return tpb.Engine(
        **{name: row[name] for name in _ENGINE_FIELDS},
        role=_ROLE[row["role"]],
        registration_generation=row["generation"],
        status=_STATUS[row["status"]],
        register_time=ts(row["registered_at"]),
        heartbeat_time=ts(row["heartbeat_at"]),
        retained_blocks=int(row["retained_blocks"]),
        free_kv_blocks=int(row.get("free_kv_blocks") or 0),
        total_kv_blocks=int(row.get("total_kv_blocks") or 0),
    )


def lease(row: Mapping[str, Any]) -> tpb.Lease:
    """A Lease message from a leases row."""
    return tpb.Lease(
        **{name: row[name] for name in _LEASE_FIELDS},
        block_groups=[tpb.BlockIdGroup(block_ids=g) for g in row["block_ids"]],
        state=LEASE_STATE[row["state"]],
        claim_id=row["claim_id"] or "",
        finish_time=ts(row["finished_at"]),
        create_time=ts(row["created_at"]),
        expire_time=ts(row["expires_at"]),
        update_time=ts(row["updated_at"]),
    )


def event(row: Mapping[str, Any]) -> tpb.LeaseEvent:
    """A LeaseEvent message from a lease_events row."""
    return tpb.LeaseEvent(
        event_id=row["event_id"],
        lease_id=row["lease_id"],
        from_state=LEASE_STATE.get(row["from_state"] or "", tpb.LEASE_STATE_UNSPECIFIED),
        to_state=LEASE_STATE[row["to_state"]],
        reason=row["reason"],
        actor=row["actor"],
        request_id=row["request_id"],
        event_time=ts(row["created_at"]),
        claim_id=row["claim_id"],
    )
