"""The retention policy (boomerang_server.retention): holds, values, and what it releases first."""

from __future__ import annotations

import pytest
from boomerang_server.retention import (
    MEMORY_PRESSURE,
    RETENTION_POLICY,
    EngineMemory,
    Evidence,
    Held,
    Params,
    Pauses,
    Policy,
    choose_releases,
    hold_seconds,
    next_turn_probability,
    pressure_shortfall,
)

PARAMS = Params(min_samples=10, min_hold_seconds=5.0, pressure_free_share=0.1)
SEEN = Evidence(Pauses(float(s) for s in range(1, 101)), continue_share=0.75)  # pauses 1..100 s


def held(lid: str, idle: float, tenant: str = "t", engine: str = "d", tokens: int = 3200, blocks: int = 200,
         cap: float = 470.0) -> Held:
    return Held(lid, tenant, "m", engine, idle, cap, tokens, blocks)


def test_policies_parse_and_name_the_forms_when_wrong() -> None:
    assert Policy.parse("p99") == Policy("quantile", 0.99) and str(Policy.parse("P99.9")) == "p99.9"
    assert Policy.parse(" off ").mode == "off" and Policy.parse("ttl").mode == "ttl"
    for bad in ("p100", "p0", "99", "sometimes", ""):
        with pytest.raises(ValueError, match="off, ttl or pNN"):
            Policy.parse(bad)


def test_hold_is_the_quantile_once_trusted_bounded_by_the_cap_and_the_floor() -> None:
    p99 = Policy.parse("p99")
    assert hold_seconds(p99, SEEN, 470, PARAMS) == 100.0
    assert hold_seconds(p99, SEEN, 60, PARAMS) == 60  # never beyond the TTL-bound cap
    assert hold_seconds(Policy.parse("p50"), SEEN, 470, PARAMS) == 51.0
    assert hold_seconds(Policy.parse("p1"), SEEN, 470, PARAMS) == 5.0  # the floor
    few = Evidence(Pauses([1.0, 2.0]))
    assert hold_seconds(p99, few, 470, PARAMS) == 470  # too few pauses: the TTL (conservative)
    assert hold_seconds(Policy.parse("ttl"), SEEN, 470, PARAMS) == 470
    assert hold_seconds(Policy.parse("off"), SEEN, 470, PARAMS) is None


def test_a_next_turn_grows_less_likely_with_idleness() -> None:
    assert next_turn_probability(0, SEEN) == pytest.approx(0.75)
    assert next_turn_probability(50, SEEN) < next_turn_probability(10, SEEN)
    assert next_turn_probability(200, SEEN) == 0.0
    assert next_turn_probability(200, Evidence()) == 1.0  # nothing known: assume it goes on


def test_idle_past_the_policy_is_released_and_off_never() -> None:
    leases = [held("young", 20), held("old", 150), held("exempt", 400, tenant="vip")]
    policy = {"t": Policy.parse("p99"), "vip": Policy.parse("off")}
    got = choose_releases(leases, lambda t, m: SEEN, policy.__getitem__, {}, PARAMS)
    assert got == [("old", RETENTION_POLICY)]


def test_memory_pressure_releases_the_least_valuable_first_and_only_what_is_needed() -> None:
    leases = [
        held("fresh-long", 1, tokens=8000, blocks=500),  # likely back, much to save
        held("stale", 80, tokens=8000, blocks=500),  # idle long: a next turn is unlikely
        held("short", 1, tokens=200, blocks=300),  # little to save per block
        held("other-engine", 90, engine="d2"),
        held("exempt", 90, tenant="vip"),
    ]
    policy = {"t": Policy.parse("ttl"), "vip": Policy.parse("off")}
    engines = {"d": EngineMemory(free_blocks=200, total_blocks=10_000), "d2": EngineMemory(5000, 10_000)}
    assert pressure_shortfall(engines["d"], 0.1) == 800
    got = choose_releases(leases, lambda t, m: SEEN, policy.__getitem__, engines, PARAMS)
    # short: 0.7 tokens per block at P 0.75; stale: 16 per block at P 0.38; 800 blocks take both.
    assert got == [("short", MEMORY_PRESSURE), ("stale", MEMORY_PRESSURE)]
    # Leases the policy releases anyway count towards the shortfall: 500 of the 800 blocks.
    p99 = {"t": Policy.parse("p99"), "vip": Policy.parse("off")}
    gone = [*leases, held("gone", 150, blocks=500)]
    assert choose_releases(gone, lambda t, m: SEEN, p99.__getitem__, engines, PARAMS) == [
        ("gone", RETENTION_POLICY), ("short", MEMORY_PRESSURE)]
    assert pressure_shortfall(EngineMemory(0, 0), 0.1) == 0  # not reported: no pressure


def test_a_hold_as_long_as_the_lease_leaves_it_to_its_deadline() -> None:
    # TTL-bound (too few pauses, or `ttl`): released by expiry at the deadline, never by the policy.
    leases = [held("at-deadline", 470, cap=470), held("past", 500, cap=470)]
    few = Evidence(Pauses([1.0]))
    assert choose_releases(leases, lambda t, m: few, lambda t: Policy.parse("p99"), {}, PARAMS) == []
