"""The claim-outcome rules (no gRPC, no SQL)."""

from __future__ import annotations

import pytest
from boomerang_registry.claim_store import Candidate, candidate_failure, explain_no_claim
from boomerang_server.leases import ClaimOutcome, LeaseState


def cand(**kw: object) -> Candidate:
    base = {"lease_id": "l", "state": LeaseState.RETAINED, "engine_ok": True, "block_size_ok": True,
                "common_tokens": 512, "remaining_seconds": 100.0}
    base.update(kw)
    return Candidate(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "candidate, outcome",
    [
        (cand(block_size_ok=False), ClaimOutcome.BLOCK_SIZE_MISMATCH),
        (cand(common_tokens=0), ClaimOutcome.PREFIX_MISMATCH),
        (cand(engine_ok=False), ClaimOutcome.ENGINE_INVALID),
        (cand(common_tokens=32), ClaimOutcome.BELOW_THRESHOLD),
        (cand(remaining_seconds=3.0), ClaimOutcome.EXPIRING),
        (cand(state=LeaseState.CLAIMED), ClaimOutcome.ALREADY_CLAIMED),
    ],
)
def test_candidate_failure(candidate: Candidate, outcome: ClaimOutcome) -> None:
    assert candidate_failure(candidate, min_tokens=64, min_remaining=5.0) is outcome


def test_no_candidates_is_no_lease() -> None:
    assert explain_no_claim([], 64, 5.0) == (ClaimOutcome.NO_LEASE, None)


def test_reports_the_candidate_closest_to_success() -> None:
    mismatch = cand(lease_id="a", common_tokens=0)
    expiring = cand(lease_id="b", remaining_seconds=1.0)
    outcome, best = explain_no_claim([mismatch, expiring], 64, 5.0)
    assert outcome is ClaimOutcome.EXPIRING and best is expiring
