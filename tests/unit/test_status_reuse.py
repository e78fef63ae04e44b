"""`boomerang status`'s reuse outcomes from a gateway's real counters."""

from __future__ import annotations

from boomerang_cli.status import outcomes_from_metrics
from boomerang_gateway import control
from boomerang_gateway.metrics import GatewayMetrics


def test_outcomes_from_a_gateways_counters() -> None:
    m = GatewayMetrics()
    m.observe_reuse(control.reuse_outcome("COLD", "NO_LEASE", 300, 0, 0))
    m.observe_reuse(control.reuse_outcome("PULL", "VERIFIED_PREFIX", 500, 352, 352))
    m.observe_reuse(control.reuse_outcome("PULL", "VERIFIED_PREFIX", 700, 480, 100))
    m.observe_reuse(control.reuse_outcome("RECOMPUTE", "TOKENIZE_FAILED", 0, 0, None))
    text = m.exposition()[0].decode()
    assert 'boomerang_gateway_reuse_declined_turns_total{reason="PREFILL_SHORTFALL"} 1.0' in text
    o = outcomes_from_metrics(text)
    assert (o["turns"], o["prompt_tokens"], o["planned_tokens"], o["delivered_tokens"]) == (4, 1500, 832, 452)
    assert o["reported_turns"] == 3 and o["reuse_rate"] == 0.25
    # Not every turn reported a count, so delivered/planned cannot be told from totals.
    assert o["delivery_rate"] is None
    assert {x["reason"]: x["turns"] for x in o["misses_by_reason"]} == {
        "NO_LEASE": 1, "PREFILL_SHORTFALL": 1, "TOKENIZE_FAILED": 1}
    assert o["source"] == "gateway counters since it started"


def test_counters_of_a_gateway_where_every_turn_reported() -> None:
    m = GatewayMetrics()
    m.observe_reuse(control.reuse_outcome("PULL", "VERIFIED_PREFIX", 500, 400, 400))
    m.observe_reuse(control.reuse_outcome("PULL", "VERIFIED_PREFIX", 500, 400, 200))
    o = outcomes_from_metrics(m.exposition()[0].decode())
    assert o["delivery_rate"] == 0.75 and o["reuse_rate"] == 0.5
