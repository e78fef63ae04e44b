"""The lease's rules, free of gRPC and SQL: claim outcomes and validated inputs.

A lease is one retained turn. `RETAINED → CLAIMED → CONSUMED`, or
`RETAINED → EXPIRED | SUPERSEDED | INVALIDATED | RELEASED`, and `CLAIMED → RETAINED` only when the
prefill node reports it never read. A claimed lease can still expire or be invalidated
(the decode node frees its blocks at its own deadline whoever holds the claim), never be
released. Each transition is one guarded SQL statement (`statements.py`, `expiry.py`,
`release_store.py`): the state a statement requires is in its WHERE clause.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from boomerang.tokenchain import TokenChain

# Defined once in the library; re-exported because the registry speaks of them as its own.
from boomerang_server.leases import ClaimOutcome as ClaimOutcome
from boomerang_server.leases import LeaseState as LeaseState


class EngineRole(str, enum.Enum):
    """An engine's role, stored by name."""

    PREFILL = "PREFILL"
    DECODE = "DECODE"


@dataclass(frozen=True)
class EngineSpec:
    """A validated engine registration."""

    engine_id: str
    role: EngineRole
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
class Candidate:
    """A live lease of the conversation as the claim statement saw it."""

    lease_id: str
    state: LeaseState
    engine_ok: bool
    block_size_ok: bool
    common_tokens: int
    remaining_seconds: float


# The order in which a failed claim's reasons are reported: the one closest to success
# wins, so an operator sees what would have had to change for reuse to happen.
_FAILURE_RANK = {
    ClaimOutcome.ALREADY_CLAIMED: 6,
    ClaimOutcome.EXPIRING: 5,
    ClaimOutcome.BELOW_THRESHOLD: 4,
    ClaimOutcome.ENGINE_INVALID: 3,
    ClaimOutcome.PREFIX_MISMATCH: 2,
    ClaimOutcome.BLOCK_SIZE_MISMATCH: 1,
}


def candidate_failure(c: Candidate, min_tokens: int, min_remaining: float) -> ClaimOutcome:
    """Why this candidate cannot be (or was not) claimed."""
    if not c.block_size_ok:
        return ClaimOutcome.BLOCK_SIZE_MISMATCH
    if c.common_tokens == 0:
        return ClaimOutcome.PREFIX_MISMATCH
    if not c.engine_ok:
        return ClaimOutcome.ENGINE_INVALID
    if c.common_tokens < min_tokens:
        return ClaimOutcome.BELOW_THRESHOLD
    if c.remaining_seconds <= min_remaining:
        return ClaimOutcome.EXPIRING
    return ClaimOutcome.ALREADY_CLAIMED


def explain_no_claim(
    candidates: list[Candidate], min_tokens: int, min_remaining: float
) -> tuple[ClaimOutcome, Candidate | None]:
    """The outcome to report when nothing was claimed, and the candidate it is about."""
    if not candidates:
        return ClaimOutcome.NO_LEASE, None
    scored = [(candidate_failure(c, min_tokens, min_remaining), c) for c in candidates]
    outcome, best = max(scored, key=lambda oc: (_FAILURE_RANK[oc[0]], oc[1].common_tokens))
    return outcome, best
