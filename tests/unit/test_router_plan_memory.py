"""The router's plan memory stays bounded when turns are never reported (it once grew to 280 MB)."""

from __future__ import annotations

import gc
import tracemalloc

from boomerang_router.domain import KvParams, PlanDecision, PlanReason
from boomerang_router.plan_store import PlanRecord, PlanStore, new_plan_id, plan_bytes, plan_time

MB = 2**20


def pull_plan(i: int, blocks: int) -> PlanRecord:
    """A PULL plan whose handle holds `blocks` block ids (distinct large ints, as real ones are)."""
    pid = new_plan_id()
    ids = tuple(range(1_000_000 + i * blocks, 1_000_000 + (i + 1) * blocks))
    return PlanRecord(
        pid, plan_time(pid), f"tenant-{i % 97}", f"conversation-{i}", "model", f"request-{i}", PlanDecision.PULL,
        PlanReason.VERIFIED_PREFIX, "prefill-0", "http://p", "decode-0", "http://d", blocks * 16, blocks * 16, 0,
        blocks * 16, 64, "decode-0", f"lease-{i}", f"claim-{i}",
        params=KvParams(do_remote_prefill=True, remote_block_ids=(ids,), remote_engine_id="decode-0"),
    )


def test_the_byte_budget_evicts_the_oldest_plans() -> None:
    store = PlanStore(ttl=900, max_plans=1_000_000, max_bytes=4 * MB)
    evicted: list[PlanRecord] = []
    for i in range(2000):
        evicted += store.put(pull_plan(i, 1000))
    size = plan_bytes(pull_plan(0, 1000))
    assert store.bytes <= 4 * MB and len(store) == (4 * MB) // size
    assert len(evicted) == 2000 - len(store)
    assert [r.conversation_id for r in evicted[:3]] == ["conversation-0", "conversation-1", "conversation-2"]
    assert store.by_request("tenant-0", "request-0") is None and store.by_claim("claim-0") is None
    assert store.by_claim("claim-1999") is not None


def test_memory_held_stays_near_the_budget_when_no_turn_is_reported() -> None:
    budget = 8 * MB
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        store = PlanStore(ttl=900, max_plans=100_000, max_bytes=budget)
        for i in range(6000):  # ~230 MB of block ids if every plan were kept
            store.put(pull_plan(i, 1000))
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert store.bytes <= budget
    # The estimate is close to what the plans really hold, so the bound is a real one.
    assert held < 1.5 * budget, f"{held / MB:.1f} MB held for a {budget / MB:.0f} MB budget"
    assert held > 0.5 * budget


def test_without_params_a_plan_is_cheap_and_the_count_limit_still_holds() -> None:
    store = PlanStore(ttl=900, max_plans=100, max_bytes=64 * MB)
    for i in range(300):
        record = pull_plan(i, 10)
        record.params = None
        store.put(record)
    assert len(store) == 100 and store.bytes == 100 * plan_bytes(record)
