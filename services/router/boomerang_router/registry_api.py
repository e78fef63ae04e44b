"""The registry as the router calls it: the router's own values in and out, the protos kept here.

The planner, the claim keeper and the reporter call these methods; only this module (and
`engine_health.py`, which reads ListEngines into the pool) builds or reads registry messages.
Every method raises `BoomerangClientError` when the call fails, as the typed client does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

from boomerang import chainproto
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient
from boomerang.errors import BoomerangError, Code
from boomerang.grpcutil import from_code_number
from boomerang.tokenchain import TokenChain
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb
from boomerang_server.leases import ClaimOutcome

from boomerang_router.domain import ClaimResult, LeaseHandle

# A pending claim, as the planner asked it (kept whole: an orphan probe re-asks it).
ClaimRequest: TypeAlias = rpb.ClaimReuseRequest

_CLAIM_STATUS = {
    rpb.CLAIM_OUTCOME_CLAIMED: ClaimOutcome.CLAIMED,
    rpb.CLAIM_OUTCOME_NO_LEASE: ClaimOutcome.NO_LEASE,
    rpb.CLAIM_OUTCOME_EXPIRING: ClaimOutcome.EXPIRING,
    rpb.CLAIM_OUTCOME_PREFIX_MISMATCH: ClaimOutcome.PREFIX_MISMATCH,
    rpb.CLAIM_OUTCOME_BELOW_THRESHOLD: ClaimOutcome.BELOW_THRESHOLD,
    rpb.CLAIM_OUTCOME_ENGINE_INVALID: ClaimOutcome.ENGINE_INVALID,
    rpb.CLAIM_OUTCOME_ALREADY_CLAIMED: ClaimOutcome.ALREADY_CLAIMED,
    rpb.CLAIM_OUTCOME_BLOCK_SIZE_MISMATCH: ClaimOutcome.BLOCK_SIZE_MISMATCH,
    rpb.CLAIM_OUTCOME_LEASE_RELEASED: ClaimOutcome.LEASE_RELEASED,
}
_LEASE_STATE_NAME = {v: k for k, v in tpb.LeaseState.items()}
# A min_reusable_tokens no prompt can reach: a claim asked with it can only return an
# earlier claim under the same claim id (CLAIM_SQL's `prior`), never take a new one.
_NEVER = 2**62


def lease_state_name(state: int) -> str:
    """`CONSUMED` for LEASE_STATE_CONSUMED, etc."""
    name: str = _LEASE_STATE_NAME.get(state, "LEASE_STATE_UNSPECIFIED")
    return name.removeprefix("LEASE_STATE_")


def claim_result(resp: rpb.ClaimReuseResponse) -> ClaimResult:
    """A ClaimReuse answer as the planner needs it; CLAIMED without its lease is UNAVAILABLE."""
    status = _CLAIM_STATUS.get(resp.outcome, ClaimOutcome.UNAVAILABLE)
    lease = lease_handle(resp.lease) if status is ClaimOutcome.CLAIMED and resp.HasField("lease") else None
    if status is ClaimOutcome.CLAIMED and lease is None:
        status = ClaimOutcome.UNAVAILABLE
    detail = ""
    if status is ClaimOutcome.LEASE_RELEASED and resp.HasField("lease"):
        detail = f"lease {resp.lease.lease_id} on {resp.lease.engine_id} was released early"
    return ClaimResult(status, lease, int(resp.reusable_tokens), float(resp.remaining_seconds), detail)


def lease_handle(lease: tpb.Lease) -> LeaseHandle:
    """The claimed lease as the plan decision needs it."""
    return LeaseHandle(
        lease_id=lease.lease_id,
        claim_id=lease.claim_id,
        engine_id=lease.engine_id,
        engine_generation=lease.engine_generation,
        remote_request_id=lease.remote_request_id,
        block_groups=tuple(tuple(g.block_ids) for g in lease.block_groups),
        num_tokens=lease.num_tokens,
        block_size=lease.block_size,
        remote_host=lease.remote_host,
        remote_port=lease.remote_port,
        tp_size=lease.tp_size or 1,
        dcp_size=lease.dcp_size or 1,
        pp_size=lease.pp_size or 1,
    )


def claim_request(
    tenant: str,
    conversation_id: str,
    chain: TokenChain,
    min_reusable_tokens: int,
    min_remaining_seconds: float,
    claim_id: str,
    model: str,
    token_ids: Sequence[int] | None = None,
) -> ClaimRequest:
    """The ClaimReuse call for one turn (without a conversation id, with the prompt's tokens)."""
    return rpb.ClaimReuseRequest(
        tenant=tenant,
        conversation_id=conversation_id,
        prompt_chain=chainproto.to_proto(chain),
        min_reusable_tokens=min_reusable_tokens,
        min_remaining_seconds=min_remaining_seconds,
        claim_id=claim_id,
        model=model,
        prompt_token_ids=token_ids or (),
    )


@dataclass(frozen=True)
class DecodeEngine:
    """A decode engine as its own handle describes it, for RegisterEngine."""

    engine_id: str
    model: str
    host: str
    port: int
    http_base_url: str
    generation: int
    block_size: int
    tp_size: int
    dcp_size: int
    pp_size: int


@dataclass(frozen=True)
class Retained:
    """A decode engine's retained blocks, for RegisterRetainedBlocks."""

    tenant: str
    conversation_id: str
    engine_id: str
    engine_generation: int
    remote_request_id: str
    block_groups: Sequence[Sequence[int]]
    chain: TokenChain
    finish_time_unix: float
    remote_host: str
    remote_port: int
    model: str
    request_id: str
    prompt_tokens: int = 0  # the previous prompt's length; 0: found by conversation id only
    prompt_tail_ids: Sequence[int] = ()  # its partial last block's token ids


@dataclass(frozen=True)
class TurnClaim:
    """A PULL plan's claim, settled at its turn's end: consumed when read, else given back."""

    lease_id: str
    claim_id: str
    read: bool
    release_reason: str = "PREFILL_DID_NOT_READ"


@dataclass
class TurnEnd:
    """CompleteTurn's answer: each part's result, or the error that part alone failed with."""

    claim_state: str = ""  # the claimed lease's state after it, e.g. `CONSUMED`
    claim_error: BoomerangClientError | None = None
    created: bool = False
    lease: tpb.Lease | None = None  # the registered lease
    registration_error: BoomerangClientError | None = None


def retained_request(r: Retained) -> rpb.RegisterRetainedBlocksRequest:
    """The RegisterRetainedBlocks message of `r`."""
    return rpb.RegisterRetainedBlocksRequest(
        tenant=r.tenant,
        conversation_id=r.conversation_id,
        engine_id=r.engine_id,
        engine_generation=r.engine_generation,
        remote_request_id=r.remote_request_id,
        block_groups=[tpb.BlockIdGroup(block_ids=list(g)) for g in r.block_groups],
        num_tokens=r.chain.num_tokens,
        token_chain=chainproto.to_proto(r.chain),
        finish_time_unix=r.finish_time_unix,
        remote_host=r.remote_host,
        remote_port=r.remote_port,
        model=r.model,
        request_id=r.request_id,
        prompt_tokens=r.prompt_tokens,
        prompt_tail_token_ids=r.prompt_tail_ids,
    )


class RouterRegistry:
    """The registry RPCs the router makes, over the typed client."""

    def __init__(self, client: RegistryClient):
        self.client = client

    async def claim_in_registry(self, req: ClaimRequest, timeout: float) -> ClaimResult:
        """ClaimReuse; a CLAIMED answer without its lease counts as UNAVAILABLE."""
        return claim_result(await self.client.claim_reuse(req, timeout=timeout))

    async def claim_batch_in_registry(
        self, reqs: Sequence[ClaimRequest], timeout: float
    ) -> list[ClaimResult | BoomerangClientError]:
        """ClaimReuseBatch: each claim's result, or the error that claim alone failed with."""
        resp = await self.client.claim_reuse_batch(rpb.ClaimReuseBatchRequest(claims=reqs), timeout=timeout)
        if len(resp.results) != len(reqs):
            raise BoomerangClientError(
                "ClaimReuseBatch",
                BoomerangError(Code.INTERNAL, "BATCH_MISMATCH", f"{len(resp.results)} results for {len(reqs)} claims"),
            )
        out: list[ClaimResult | BoomerangClientError] = []
        for r in resp.results:
            if r.error_code:
                out.append(BoomerangClientError("ClaimReuse", from_code_number(r.error_code, r.error_reason, r.error_message)))
            else:
                out.append(claim_result(r.response))
        return out

    async def find_claim(self, req: ClaimRequest, timeout: float) -> str | None:
        """The lease id an earlier `req` claimed, if it did; never claims anything itself."""
        probe = rpb.ClaimReuseRequest()
        probe.CopyFrom(req)
        probe.min_reusable_tokens = _NEVER
        resp = await self.client.claim_reuse(probe, timeout=timeout)
        if resp.outcome != rpb.CLAIM_OUTCOME_CLAIMED or not resp.HasField("lease"):
            return None
        return resp.lease.lease_id

    async def heartbeat_in_registry(self, engine_id: str, generation: int, timeout: float) -> None:
        """Heartbeat on an engine's behalf (no load figures)."""
        await self.client.heartbeat(
            rpb.HeartbeatRequest(engine_id=engine_id, registration_generation=generation), timeout=timeout
        )

    async def complete_turn_in_registry(
        self, tenant: str, claim: TurnClaim | None, retained: Retained | None, timeout: float
    ) -> TurnEnd:
        """CompleteTurn: the claim settled and the blocks registered in one call (either may be None)."""
        req = rpb.CompleteTurnRequest(tenant=tenant)
        if claim is not None:
            req.claim.lease_id, req.claim.claim_id = claim.lease_id, claim.claim_id
            req.claim.use = rpb.CLAIM_USE_READ if claim.read else rpb.CLAIM_USE_NOT_READ
            req.claim.release_reason = "" if claim.read else claim.release_reason
        if retained is not None:
            req.registration.CopyFrom(retained_request(retained))
            req.registration.tenant = ""  # CompleteTurn's own tenant stands for it
        resp = await self.client.complete_turn(req, timeout=timeout)
        out = TurnEnd()
        if claim is not None:
            c = resp.claim
            if c.error_code:
                out.claim_error = BoomerangClientError("CompleteTurn", from_code_number(c.error_code, c.error_reason, c.error_message))
            else:
                out.claim_state = lease_state_name(c.lease.state)
        if retained is not None:
            r = resp.registration
            if r.error_code:
                out.registration_error = BoomerangClientError(
                    "CompleteTurn", from_code_number(r.error_code, r.error_reason, r.error_message)
                )
            else:
                out.created, out.lease = r.response.created, r.response.lease
        return out

    async def register_decode_engine(self, e: DecodeEngine, request_id: str, timeout: float) -> None:
        """RegisterEngine for a decode engine."""
        engine = tpb.Engine(
            engine_id=e.engine_id,
            role=tpb.ENGINE_ROLE_DECODE,
            model=e.model,
            side_channel_host=e.host,
            side_channel_port=e.port,
            http_base_url=e.http_base_url,
            registration_generation=e.generation,
            block_size=e.block_size,
            tp_size=e.tp_size,
            dcp_size=e.dcp_size,
            pp_size=e.pp_size,
        )
        await self.client.register_engine(rpb.RegisterEngineRequest(engine=engine, request_id=request_id), timeout=timeout)
