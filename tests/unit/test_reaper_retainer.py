"""The reaper's retention job: evidence from the history and leases as the policy sees them."""

from __future__ import annotations

import pytest
from boomerang.v1 import types_pb2 as tpb
from boomerang_reaper.advice import TurnRecord
from boomerang_reaper.retainer import evidence_from, held_from
from boomerang_server.retention import EngineMemory, pressure_shortfall


def turn(conv: str, finished: float, claimed: float | None = None, tenant: str = "t") -> TurnRecord:
    return TurnRecord(tenant, "m", conv, f"{conv}-{finished}", finished, 10, claimed_at=claimed)


def test_evidence_pairs_turns_and_leaves_unsettled_last_turns_out_of_the_share() -> None:
    records = [
        turn("a", 0, claimed=3), turn("a", 10),  # a pause of 3 s, then a last turn long ago: ended
        turn("b", 0), turn("b", 20),  # unclaimed: the pause is bounded by the next turn's end
        turn("c", 990),  # too recent to say whether it goes on
    ]
    got = evidence_from(records, history_end=1000, settle_seconds=480)
    ev = got[("t", "m")]
    assert ev.pauses.seen == [3.0, 20.0]
    assert ev.continue_share == pytest.approx(2 / 4)  # a→a, b→b went on; a's and b's last turns ended


def test_held_leases_carry_idle_time_cap_and_blocks() -> None:
    lease = tpb.Lease(lease_id="x", tenant="t", model="m", engine_id="d", state=tpb.LEASE_STATE_RETAINED,
                      num_tokens=320, block_groups=[tpb.BlockIdGroup(block_ids=list(range(20)))])
    lease.finish_time.FromSeconds(1000)
    lease.expire_time.FromSeconds(1470)
    claimed = tpb.Lease(lease_id="y", state=tpb.LEASE_STATE_CLAIMED)
    [h] = held_from([lease, claimed], db_now=1060.0)
    assert (h.lease_id, h.idle_seconds, h.cap_seconds, h.num_blocks, h.num_tokens) == ("x", 60.0, 470.0, 20, 320)


def test_blocks_released_but_not_yet_reported_count_as_free() -> None:
    assert pressure_shortfall(EngineMemory(40, 100), 0.5) == 10
    assert pressure_shortfall(EngineMemory(40, 100, pending_blocks=10), 0.5) == 0
