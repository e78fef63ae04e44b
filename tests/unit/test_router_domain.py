"""The router's plan decision: every decision and reason, the remote_num_tokens rule."""

from __future__ import annotations

import pytest
from boomerang_router.claims import MAX_SHARE_WAIT_SECONDS, claim_wait, reply_budget
from boomerang_router.domain import (
    ClaimResult,
    HandleUse,
    LeaseHandle,
    PlanDecision,
    PlanReason,
    claim_floor,
    decide,
    decide_started,
    max_reusable_tokens,
    reusable_tokens,
    turn_outcome,
)
from boomerang_router.ttft import CopyCost, PrefillCost, TurnCosts
from boomerang_server.leases import ClaimOutcome

BS = 16


def lease(num_tokens: int = 320, block_size: int = BS, groups: tuple[tuple[int, ...], ...] | None = None) -> LeaseHandle:
    blocks = -(-num_tokens // block_size)
    return LeaseHandle(
        lease_id="l1",
        claim_id="c1",
        engine_id="d1",
        engine_generation=3,
        remote_request_id="cmpl-1",
        block_groups=groups if groups is not None else (tuple(range(100, 100 + blocks)),),
        num_tokens=num_tokens,
        block_size=block_size,
        remote_host="10.0.0.9",
        remote_port=5600,
        tp_size=2,
        dcp_size=1,
        pp_size=1,
    )


def claimed(verified: int, **kw) -> ClaimResult:  # type: ignore[no-untyped-def]
    return ClaimResult(ClaimOutcome.CLAIMED, lease(**kw), verified, 300.0)


@pytest.mark.parametrize(
    ("status", "decision", "reason"),
    [
        (ClaimOutcome.NO_LEASE, PlanDecision.COLD, PlanReason.NO_LEASE),
        (ClaimOutcome.NOT_ASKED, PlanDecision.COLD, PlanReason.NO_CONVERSATION),
        (ClaimOutcome.UNAVAILABLE, PlanDecision.COLD, PlanReason.CONTROL_PLANE_DEGRADED),
        (ClaimOutcome.EXPIRING, PlanDecision.RECOMPUTE, PlanReason.EXPIRING),
        (ClaimOutcome.PREFIX_MISMATCH, PlanDecision.RECOMPUTE, PlanReason.PREFIX_MISMATCH),
        (ClaimOutcome.BELOW_THRESHOLD, PlanDecision.RECOMPUTE, PlanReason.BELOW_THRESHOLD),
        (ClaimOutcome.ENGINE_INVALID, PlanDecision.RECOMPUTE, PlanReason.ENGINE_UNAVAILABLE),
        (ClaimOutcome.ALREADY_CLAIMED, PlanDecision.RECOMPUTE, PlanReason.ALREADY_CLAIMED),
        (ClaimOutcome.BLOCK_SIZE_MISMATCH, PlanDecision.RECOMPUTE, PlanReason.BLOCK_SIZE_MISMATCH),
        (ClaimOutcome.LEASE_RELEASED, PlanDecision.COLD, PlanReason.LEASE_RELEASED),
    ],
)
def test_every_unclaimed_outcome_maps_to_its_decision_and_reason(
    status: ClaimOutcome, decision: PlanDecision, reason: PlanReason
) -> None:
    d = decide(ClaimResult(status, None, 48), prompt_tokens=500, block_size=BS, threshold=64)
    assert (d.decision, d.reason) == (decision, reason)
    assert d.reusable_tokens == 0 and d.recompute_tokens == 500 and d.verified_tokens == 48
    assert not d.release_claim


def test_every_reason_is_reachable() -> None:
    """No PlanReason is dead: each one is produced by some claim."""
    seen = set()
    for status in ClaimOutcome:
        result = ClaimResult(status, lease() if status is ClaimOutcome.CLAIMED else None, 320)
        seen.add(decide(result, 500, BS, 64).reason)
    seen.add(decide(claimed(320), 500, BS, 64, source_engine_alive=False).reason)
    seen.add(decide(claimed(32), 500, BS, 64).reason)
    very_slow_link = TurnCosts(PrefillCost(1.0, 0.01, 0.0, 0.0), CopyCost(1.0, 1.0))
    seen.add(decide(claimed(320), 500, BS, 64, costs=very_slow_link).reason)
    seen.add(decide_started(ClaimResult(ClaimOutcome.BELOW_THRESHOLD, None, 320), 500, BS, 64).reason)
    assert seen == set(PlanReason)


def test_a_started_turns_plan_says_what_it_missed_and_not_its_own_lease() -> None:
    def started(status: ClaimOutcome, verified: int, prompt: int = 500) -> tuple[PlanDecision, PlanReason, int]:
        d = decide_started(ClaimResult(status, None, verified), prompt, BS, 64)
        assert d.reusable_tokens == 0 and not d.release_claim
        return d.decision, d.reason, d.verified_tokens

    # An earlier turn's lease it would have pulled (the registry refused only the floor it was asked).
    assert started(ClaimOutcome.BELOW_THRESHOLD, 330) == (PlanDecision.RECOMPUTE, PlanReason.TURN_STARTED, 320)
    # The turn's own lease covers the whole prompt: nothing was there to pull when it started.
    assert started(ClaimOutcome.BELOW_THRESHOLD, 500) == (PlanDecision.COLD, PlanReason.NO_LEASE, 0)
    # Too short a prefix for any plan, and every other outcome, as any claim decides them.
    assert started(ClaimOutcome.BELOW_THRESHOLD, 40)[:2] == (PlanDecision.RECOMPUTE, PlanReason.BELOW_THRESHOLD)
    assert started(ClaimOutcome.NO_LEASE, 0) == (PlanDecision.COLD, PlanReason.NO_LEASE, 0)
    assert started(ClaimOutcome.PREFIX_MISMATCH, 0)[:2] == (PlanDecision.RECOMPUTE, PlanReason.PREFIX_MISMATCH)


def test_pull_loads_the_verified_prefix_and_computes_the_rest() -> None:
    d = decide(claimed(320), prompt_tokens=400, block_size=BS, threshold=64)
    assert (d.decision, d.reason) == (PlanDecision.PULL, PlanReason.VERIFIED_PREFIX)
    assert d.reusable_tokens == 320 and d.recompute_tokens == 80 and not d.release_claim


def test_identical_prompt_keeps_one_block_to_compute() -> None:
    # The prompt equals everything D holds: P must still compute at least one token, so the
    # last whole block below the prompt's end is the most it may load.
    d = decide(claimed(320, num_tokens=320), prompt_tokens=320, block_size=BS, threshold=64)
    assert d.decision is PlanDecision.PULL
    assert d.reusable_tokens == 304 and d.recompute_tokens == 16


def test_verified_prefix_with_a_partial_tail_is_floored_to_whole_blocks() -> None:
    # A verified length that is not block-aligned happens only for identical sequences.
    d = decide(claimed(330, num_tokens=330), prompt_tokens=330, block_size=BS, threshold=64)
    assert d.reusable_tokens == 320 and d.reusable_tokens % BS == 0 and d.reusable_tokens < 330


def test_below_threshold_after_capping_gives_the_claim_back() -> None:
    d = decide(claimed(64, num_tokens=64), prompt_tokens=64, block_size=BS, threshold=64)
    assert (d.decision, d.reason) == (PlanDecision.RECOMPUTE, PlanReason.BELOW_THRESHOLD)
    assert d.release_claim and d.reusable_tokens == 0 and d.recompute_tokens == 64


def test_dead_source_engine_in_the_routers_view_gives_the_claim_back() -> None:
    d = decide(claimed(320), 400, BS, 64, source_engine_alive=False)
    assert (d.decision, d.reason, d.release_claim) == (PlanDecision.RECOMPUTE, PlanReason.ENGINE_UNAVAILABLE, True)


def test_lease_block_size_other_than_the_chains_gives_the_claim_back() -> None:
    d = decide(claimed(320, block_size=32), 400, BS, 64)
    assert (d.reason, d.release_claim) == (PlanReason.BLOCK_SIZE_MISMATCH, True)


def test_threshold_zero_still_needs_one_whole_block() -> None:
    assert decide(claimed(16), 40, BS, 0).decision is PlanDecision.PULL
    d = decide(claimed(16), 16, BS, 0)  # 16-token prompt: nothing may be loaded
    assert d.decision is PlanDecision.RECOMPUTE and d.release_claim


@pytest.mark.parametrize("prompt", [1, 2, 15, 16, 17, 31, 32, 33, 64, 65, 1000, 1024])
@pytest.mark.parametrize("verified", [0, 16, 17, 32, 64, 500, 1024, 2048])
def test_remote_num_tokens_rule(prompt: int, verified: int) -> None:
    """Whole blocks, strictly below the prompt, never above what was verified."""
    n = reusable_tokens(min(verified, prompt), prompt, BS)
    assert n % BS == 0
    assert 0 <= n < prompt or (n == 0 and prompt <= 1)
    assert n <= verified
    assert n <= max_reusable_tokens(prompt, BS)


def test_claim_floor_asks_for_nothing_when_no_capped_prefix_can_pay() -> None:
    assert claim_floor(400, BS, 64) == 64
    assert claim_floor(80, BS, 64) == 64  # 64 tokens may be loaded from an 80-token prompt
    assert claim_floor(64, BS, 64) == 65  # at most 48 may be loaded: claim nothing
    assert claim_floor(10, BS, 0) == 11
    assert claim_floor(100, BS, 0) == 1


def test_turn_outcomes() -> None:
    assert turn_outcome(PlanDecision.COLD, HandleUse.UNKNOWN, "") == "COMPUTED"
    assert turn_outcome(PlanDecision.PULL, HandleUse.READ, "CONSUMED") == "REUSED"
    assert turn_outcome(PlanDecision.PULL, HandleUse.UNKNOWN, "CONSUMED") == "REUSED"
    assert turn_outcome(PlanDecision.PULL, HandleUse.NOT_READ, "RETAINED") == "RELEASED"
    assert turn_outcome(PlanDecision.PULL, HandleUse.READ, "EXPIRED") == "LEASE_ENDED"
    assert HandleUse.UNKNOWN.consumed and HandleUse.READ.consumed and not HandleUse.NOT_READ.consumed


@pytest.mark.parametrize(
    ("caller", "budget"),
    [
        (1.0, 0.8),  # a fifth kept for the reply
        (0.25, 0.2),  # the gateway's PlanTurn deadline
        (0.05, 0.03),  # at least 20 ms kept
        (0.04, 0.02),
        (0.02, 0.01),  # the vLLM hook's default: never more than half kept
        (0.0, 0.0),
    ],
)
def test_a_plan_keeps_a_reply_margin_of_its_callers_deadline(caller: float, budget: float) -> None:
    assert reply_budget(caller) == pytest.approx(budget)


QWEN_SECONDS_PER_TOKEN = 0.02061 / 1000  # BOOMERANG_PREFILL_MS_PER_TOKEN's default


@pytest.mark.parametrize(
    ("tokens", "wait"),
    [
        (300, 0.05),  # a short prompt: the claim deadline
        (2_000, 0.05),  # 41 ms of prefill: a quarter is less than the deadline
        (20_000, 0.25 * 20_000 * QWEN_SECONDS_PER_TOKEN),  # 412 ms of prefill: a quarter, 103 ms
        (10**6, MAX_SHARE_WAIT_SECONDS),
    ],
)
def test_a_long_prompt_claim_waits_a_share_of_what_it_could_save(tokens: int, wait: float) -> None:
    assert claim_wait(0.05, 0.25, tokens, QWEN_SECONDS_PER_TOKEN) == pytest.approx(wait)
    assert claim_wait(0.05, 0.0, tokens, QWEN_SECONDS_PER_TOKEN) == 0.05  # share 0: the deadline alone
