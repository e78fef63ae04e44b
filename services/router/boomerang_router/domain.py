"""The plan decision, free of gRPC and SQL: pull, recompute, prefill on D, or cold, and why.

The registry's claim has already verified, by token chain, how many leading tokens of the
new prompt the lease holds (`verified`). The router then decides how many of them the
prefill engine (P) may load (`remote_num_tokens`):

* whole blocks only, because P maps tokens to D's blocks one block at a time;
* strictly fewer than the prompt, so P always computes at least one prompt token (it needs
  the last position's logits to sample the first output token);
* never more than verified — P does not check that its prompt extends D's sequence.

A pull must reach P's `kv_recompute_threshold` beyond what P's own prefix cache holds
(below it P would recompute anyway, after telling D to free the blocks, and the handle
would be wasted). Among what is allowed, the option with the smallest predicted time to
first token wins (`ttft.choose`): recompute, a pull, or a prefill on the decode engine that
holds the history.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from boomerang_server.leases import ClaimOutcome

from boomerang_router.ttft import Choice, Option, TurnCosts, choose


class PlanDecision(str, enum.Enum):
    """What the prefill engine does with the previous turn's blocks."""

    PULL = "PULL"
    RECOMPUTE = "RECOMPUTE"
    COLD = "COLD"
    # The decode engine that holds the history prefills the new tokens itself; nothing moves.
    PREFILL_ON_DECODE = "PREFILL_ON_DECODE"


class PlanReason(str, enum.Enum):
    """Why the router decided as it did (names match the proto's PlanReason)."""

    VERIFIED_PREFIX = "VERIFIED_PREFIX"
    NO_LEASE = "NO_LEASE"
    BELOW_THRESHOLD = "BELOW_THRESHOLD"
    PREFIX_MISMATCH = "PREFIX_MISMATCH"
    EXPIRING = "EXPIRING"
    ENGINE_UNAVAILABLE = "ENGINE_UNAVAILABLE"
    CONTROL_PLANE_DEGRADED = "CONTROL_PLANE_DEGRADED"
    ALREADY_CLAIMED = "ALREADY_CLAIMED"
    BLOCK_SIZE_MISMATCH = "BLOCK_SIZE_MISMATCH"
    NO_CONVERSATION = "NO_CONVERSATION"
    LEASE_RELEASED = "LEASE_RELEASED"
    RECOMPUTE_FASTER = "RECOMPUTE_FASTER"
    TURN_STARTED = "TURN_STARTED"


@dataclass(frozen=True)
class LeaseHandle:
    """A claimed lease: what P needs to read D's blocks."""

    lease_id: str
    claim_id: str
    engine_id: str
    engine_generation: int
    remote_request_id: str
    block_groups: tuple[tuple[int, ...], ...]
    num_tokens: int
    block_size: int
    remote_host: str
    remote_port: int
    tp_size: int
    dcp_size: int
    pp_size: int


@dataclass(frozen=True)
class ClaimResult:
    """The claim as the router saw it."""

    status: ClaimOutcome
    lease: LeaseHandle | None = None
    verified_tokens: int = 0
    remaining_seconds: float = 0.0
    detail: str = ""


@dataclass(frozen=True)
class Decision:
    """The plan decision and its token accounting."""

    decision: PlanDecision
    reason: PlanReason
    reusable_tokens: int
    recompute_tokens: int
    verified_tokens: int
    # The claim succeeded but the router will not hand the handle out: give it back.
    release_claim: bool = False
    choice: Choice | None = None  # the prediction it was decided by, when there was one


def max_reusable_tokens(prompt_tokens: int, block_size: int) -> int:
    """The most tokens P may load: whole blocks, strictly fewer than the prompt."""
    if prompt_tokens <= 1 or block_size <= 0:
        return 0
    return ((prompt_tokens - 1) // block_size) * block_size


def reusable_tokens(verified_tokens: int, prompt_tokens: int, block_size: int) -> int:
    """`remote_num_tokens` for a verified prefix: floored to blocks and capped below the prompt."""
    whole = (max(verified_tokens, 0) // block_size) * block_size
    return min(whole, max_reusable_tokens(prompt_tokens, block_size))


def claim_floor(prompt_tokens: int, block_size: int, threshold: int) -> int:
    """The `min_reusable_tokens` to ask the registry for.

    The threshold, except when even a fully verified prompt would be capped below it: then
    more tokens than the prompt has, so the registry claims nothing yet still says why.
    """
    floor = max(threshold, 1)
    if max_reusable_tokens(prompt_tokens, block_size) < floor:
        return prompt_tokens + 1
    return floor


_NOT_CLAIMED: dict[ClaimOutcome, tuple[PlanDecision, PlanReason]] = {
    ClaimOutcome.NO_LEASE: (PlanDecision.COLD, PlanReason.NO_LEASE),
    ClaimOutcome.NOT_ASKED: (PlanDecision.COLD, PlanReason.NO_CONVERSATION),
    # Nothing is known about the conversation's leases, so nothing was ruled out either.
    ClaimOutcome.UNAVAILABLE: (PlanDecision.COLD, PlanReason.CONTROL_PLANE_DEGRADED),
    ClaimOutcome.EXPIRING: (PlanDecision.RECOMPUTE, PlanReason.EXPIRING),
    ClaimOutcome.PREFIX_MISMATCH: (PlanDecision.RECOMPUTE, PlanReason.PREFIX_MISMATCH),
    ClaimOutcome.BELOW_THRESHOLD: (PlanDecision.RECOMPUTE, PlanReason.BELOW_THRESHOLD),
    ClaimOutcome.ENGINE_INVALID: (PlanDecision.RECOMPUTE, PlanReason.ENGINE_UNAVAILABLE),
    ClaimOutcome.ALREADY_CLAIMED: (PlanDecision.RECOMPUTE, PlanReason.ALREADY_CLAIMED),
    ClaimOutcome.BLOCK_SIZE_MISMATCH: (PlanDecision.RECOMPUTE, PlanReason.BLOCK_SIZE_MISMATCH),
    # D no longer holds the blocks, so nothing can be pulled; the reason says reuse was lost
    # to an early release (the retention policy's cost), not that there never was a lease.
    ClaimOutcome.LEASE_RELEASED: (PlanDecision.COLD, PlanReason.LEASE_RELEASED),
}


def decide(
    claim: ClaimResult,
    prompt_tokens: int,
    block_size: int,
    threshold: int,
    source_engine_alive: bool = True,
    costs: TurnCosts | None = None,
    prefill_cached: int = 0,
) -> Decision:
    """Turn a claim into a plan decision.

    `source_engine_alive` is the router's own view of the claimed lease's engine (its pool
    may see a stopped heartbeat before the registry marks the engine dead). With `costs` the
    plan is the fastest predicted option (`ttft.choose`; `prefill_cached`: what P's prefix
    cache holds); without, a pull whenever the threshold allows it.
    """
    verified = claim.verified_tokens
    if claim.status is not ClaimOutcome.CLAIMED or claim.lease is None:
        decision, reason = _NOT_CLAIMED.get(
            claim.status, (PlanDecision.COLD, PlanReason.CONTROL_PLANE_DEGRADED)
        )
        return Decision(decision, reason, 0, prompt_tokens, verified)

    def give_back(reason: PlanReason, choice: Choice | None = None) -> Decision:
        return Decision(PlanDecision.RECOMPUTE, reason, 0, prompt_tokens, verified, release_claim=True, choice=choice)

    lease = claim.lease
    if not source_engine_alive:
        return give_back(PlanReason.ENGINE_UNAVAILABLE)
    if lease.block_size != block_size:
        return give_back(PlanReason.BLOCK_SIZE_MISMATCH)
    if not lease.block_groups or not any(lease.block_groups):
        return give_back(PlanReason.ENGINE_UNAVAILABLE)
    reusable = min(reusable_tokens(verified, prompt_tokens, block_size), lease.num_tokens)
    if reusable <= 0:
        return give_back(PlanReason.BELOW_THRESHOLD)
    if costs is None:
        if reusable < threshold:
            return give_back(PlanReason.BELOW_THRESHOLD)
        return Decision(PlanDecision.PULL, PlanReason.VERIFIED_PREFIX, reusable, prompt_tokens - reusable, verified)
    c = choose(prompt_tokens, reusable, prefill_cached, block_size, threshold, costs)
    if c.option is Option.PULL:
        return Decision(
            PlanDecision.PULL, PlanReason.VERIFIED_PREFIX, c.pull_tokens, prompt_tokens - c.pull_tokens, verified,
            choice=c,
        )
    if c.option is Option.PREFILL_ON_DECODE:
        # D reads its own blocks, never the handle: the claim goes back to the conversation.
        return Decision(
            PlanDecision.PREFILL_ON_DECODE, PlanReason.VERIFIED_PREFIX, reusable, prompt_tokens - reusable, verified,
            release_claim=True, choice=c,
        )
    return give_back(PlanReason.RECOMPUTE_FASTER if c.pulls_allowed else PlanReason.BELOW_THRESHOLD, c)


def decide_started(claim: ClaimResult, prompt_tokens: int, block_size: int, threshold: int) -> Decision:
    """The plan of a turn its caller started without it (the live-lease summary ruled it out):
    its claim asked for more than the prompt holds, so nothing was claimed, yet the registry
    said what it found.

    A lease a plan would have pulled is a pull the turn missed: RECOMPUTE, reason TURN_STARTED,
    `verified_tokens` what it would have pulled. A lease that covers every whole block a pull
    may take is the turn's own, registered while this plan was on its way (or the same
    prompt's earlier answer): the turn had nothing to pull, COLD NO_LEASE. Anything else is
    decided as for any claim that failed."""
    if claim.status is ClaimOutcome.BELOW_THRESHOLD:
        if claim.verified_tokens >= max_reusable_tokens(prompt_tokens, block_size):
            return Decision(PlanDecision.COLD, PlanReason.NO_LEASE, 0, prompt_tokens, 0)
        reusable = reusable_tokens(claim.verified_tokens, prompt_tokens, block_size)
        if reusable >= max(threshold, 1):
            return Decision(PlanDecision.RECOMPUTE, PlanReason.TURN_STARTED, 0, prompt_tokens, reusable)
    return decide(claim, prompt_tokens, block_size, threshold)


class HandleUse(str, enum.Enum):
    """What the prefill engine did with a PULL plan's handle."""

    READ = "READ"
    NOT_READ = "NOT_READ"
    UNKNOWN = "UNKNOWN"

    @property
    def consumed(self) -> bool:
        """Whether the handle must be treated as used up (D may have freed the blocks)."""
        return self is not HandleUse.NOT_READ


class Retention(str, enum.Enum):
    """What became of the decode engine's retained blocks at the end of a turn."""

    REGISTERED = "REGISTERED"
    ALREADY_REGISTERED = "ALREADY_REGISTERED"
    NOT_RETAINED = "NOT_RETAINED"
    REJECTED = "REJECTED"
    NO_CONVERSATION = "NO_CONVERSATION"


def turn_outcome(decision: PlanDecision, handle_use: HandleUse, lease_state: str) -> str:
    """The one-word outcome of a reported turn, for the audit row.

    `REUSED` (P read the claimed blocks), `RELEASED` (P never read them; the claim was given
    back), `LEASE_ENDED` (P was told to read, but the registry ended the lease while it was
    claimed — worth an operator's look), or `COMPUTED` (no handle was handed out).
    """
    if decision is not PlanDecision.PULL:
        return "COMPUTED"  # also a prefill on D: it computed the new tokens over its own cache
    if not handle_use.consumed:
        return "RELEASED"
    return "REUSED" if lease_state == "CONSUMED" else "LEASE_ENDED"
