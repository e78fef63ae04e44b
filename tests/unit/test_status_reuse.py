"""`boomerang status`'s reuse outcomes: from turn_plans rows and from a gateway's real counters."""

from __future__ import annotations

from boomerang_cli.status_reuse import outcomes_from_metrics, outcomes_from_rows
from boomerang_gateway import reuse
from boomerang_gateway.metrics import GatewayMetrics


def row(miss: str | None, turns: int, prompt: int, planned: int, delivered: int, planned_reported: int,
        reported: int) -> dict[str, object]:
    return {"miss": miss, "turns": turns, "prompt_tokens": prompt, "planned_tokens": planned,
            "delivered_tokens": delivered, "planned_reported_tokens": planned_reported, "reported_turns": reported}


def test_outcomes_from_plan_rows() -> None:
    rows = [
        row(None, 6, 6000, 4800, 4800, 4800, 6),  # PULLs delivered in full
        row("NO_LEASE", 2, 800, 0, 0, 0, 2),
        row("PREFIX_MISMATCH", 1, 900, 0, 0, 0, 1),
        row("PREFILL_SHORTFALL", 1, 1000, 800, 0, 800, 1),
    ]
    o = outcomes_from_rows(rows)
    assert (o["turns"], o["planned_tokens"], o["delivered_tokens"], o["reported_turns"]) == (10, 5600, 4800, 10)
    assert o["reuse_rate"] == 0.6 and o["delivery_rate"] == round(4800 / 5600, 4)
    assert o["misses_by_reason"] == [{"reason": "NO_LEASE", "turns": 2}, {"reason": "PREFILL_SHORTFALL", "turns": 1},
                                     {"reason": "PREFIX_MISMATCH", "turns": 1}]
    assert o["exact"] is True
    empty = outcomes_from_rows([])
    assert empty["turns"] == 0 and empty["reuse_rate"] is None and empty["misses_by_reason"] == []


def test_outcomes_from_a_gateways_counters() -> None:
    m = GatewayMetrics()
    m.observe_reuse(reuse.outcome("COLD", "NO_LEASE", 300, 0, 0))
    m.observe_reuse(reuse.outcome("PULL", "VERIFIED_PREFIX", 500, 352, 352))
    m.observe_reuse(reuse.outcome("PULL", "VERIFIED_PREFIX", 700, 480, 100))
    m.observe_reuse(reuse.outcome("RECOMPUTE", "TOKENIZE_FAILED", 0, 0, None))
    text = m.exposition()[0].decode()
    assert 'boomerang_gateway_reuse_declined_turns_total{reason="PREFILL_SHORTFALL"} 1.0' in text
    o = outcomes_from_metrics(text)
    assert (o["turns"], o["prompt_tokens"], o["planned_tokens"], o["delivered_tokens"]) == (4, 1500, 832, 452)
    assert o["reported_turns"] == 3 and o["reuse_rate"] == 0.25
    # Not every turn reported a count, so delivered/planned cannot be told from totals.
    assert o["delivery_rate"] is None
    assert {x["reason"]: x["turns"] for x in o["misses_by_reason"]} == {
        "NO_LEASE": 1, "PREFILL_SHORTFALL": 1, "TOKENIZE_FAILED": 1}
    assert o["exact"] is False


def test_counters_of_a_gateway_where_every_turn_reported() -> None:
    m = GatewayMetrics()
    m.observe_reuse(reuse.outcome("PULL", "VERIFIED_PREFIX", 500, 400, 400))
    m.observe_reuse(reuse.outcome("PULL", "VERIFIED_PREFIX", 500, 400, 200))
    o = outcomes_from_metrics(m.exposition()[0].decode())
    assert o["delivery_rate"] == 0.75 and o["reuse_rate"] == 0.5
