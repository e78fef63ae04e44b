"""Engine choice: least load, retained-KV tie-break, dead and stale engines leave the pool."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from boomerang_router.engines import EnginePool
from boomerang_router.plan_store import PlanStore, claim_id_for, new_plan_id, plan_time
from boomerang_server.enginepool import EngineInfo, Role, Source, parse_static


class Clock:
    def __init__(self) -> None:
        self.mono = 1000.0
        self.wall = 1_800_000_000.0

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds

    def at(self, ago: float = 0.0) -> datetime:
        return datetime.fromtimestamp(self.wall - ago, tz=UTC)


def eng(engine_id: str, role: Role, clock: Clock, **kw) -> EngineInfo:  # type: ignore[no-untyped-def]
    base = {"model": "m", "http_base_url": f"http://127.0.0.1/{engine_id}", "generation": 1, "heartbeat_at": clock.at(), "block_size": 16}
    base.update(kw)
    return EngineInfo(engine_id=engine_id, role=role, **base)  # type: ignore[arg-type]


@pytest.fixture
def clock() -> Clock:
    return Clock()


def pool_with(clock: Clock, *engines: EngineInfo, timeout: float = 30.0) -> EnginePool:
    p = EnginePool(heartbeat_timeout=timeout, inflight_token_weight=100, mono=lambda: clock.mono, wall=lambda: clock.wall)
    p.apply_registry_snapshot(engines)
    return p


def test_prefill_by_least_queued_tokens_and_in_flight(clock: Clock) -> None:
    p = pool_with(
        clock,
        eng("p1", Role.PREFILL, clock, queued_prompt_tokens=1000),
        eng("p2", Role.PREFILL, clock, in_flight=5),  # 5 × 100 = 500
        eng("p3", Role.PREFILL, clock, queued_prompt_tokens=800),
    )
    chosen = p.choose("m", Role.PREFILL)
    assert chosen is not None and chosen.engine_id == "p2"


def test_decode_by_in_flight_then_least_retained_memory(clock: Clock) -> None:
    p = pool_with(
        clock,
        eng("d1", Role.DECODE, clock, in_flight=2, retained_blocks=10),
        eng("d2", Role.DECODE, clock, in_flight=1, retained_blocks=500, bytes_per_block=1),
        eng("d3", Role.DECODE, clock, in_flight=1, retained_blocks=100, bytes_per_block=2),
    )
    chosen = p.choose("m", Role.DECODE)
    assert chosen is not None and chosen.engine_id == "d3"  # 200 bytes < 500 bytes


def test_planned_turns_spread_load_and_uncount(clock: Clock) -> None:
    p = pool_with(clock, eng("p1", Role.PREFILL, clock), eng("p2", Role.PREFILL, clock))
    picks = []
    for _ in range(4):
        chosen = p.choose("m", Role.PREFILL)
        assert chosen is not None
        picks.append(chosen.engine_id)
        p.add_planned(chosen.engine_id, 1, 50)
    assert picks == ["p1", "p2", "p1", "p2"]
    p.add_planned("p1", -2, -100)
    entries = {e.info.engine_id: e for e in p.entries(role=Role.PREFILL)}
    assert entries["p1"].planned_turns == 0 and entries["p2"].planned_turns == 2
    assert entries["p2"].load == 2 * 100 + 100


def test_dead_and_stale_engines_leave_the_pool(clock: Clock) -> None:
    p = pool_with(
        clock,
        eng("d-dead", Role.DECODE, clock, active=False),
        eng("d-old", Role.DECODE, clock, heartbeat_at=clock.at(ago=120)),
        eng("d-ok", Role.DECODE, clock, in_flight=50),
    )
    chosen = p.choose("m", Role.DECODE)
    assert chosen is not None and chosen.engine_id == "d-ok"
    reasons = {e.info.engine_id: e.unavailable_reason for e in p.entries()}
    assert reasons == {"d-dead": "DEAD", "d-old": "HEARTBEAT_STALE", "d-ok": ""}
    assert not p.source_alive("d-dead", 1) and not p.source_alive("d-old", 1) and p.source_alive("d-ok", 1)


def test_heartbeat_staleness_follows_progress_not_clock_skew(clock: Clock) -> None:
    # The database clock runs 40 s behind the router's: the first sight looks old...
    skewed = eng("d1", Role.DECODE, clock, heartbeat_at=clock.at(ago=40))
    p = pool_with(clock, skewed)
    assert p.choose("m", Role.DECODE) is None
    # ...but once the heartbeat advances, it is judged by the router's own clock.
    clock.advance(1)
    p.apply_registry_snapshot([eng("d1", Role.DECODE, clock, heartbeat_at=clock.at(ago=39))])
    assert p.choose("m", Role.DECODE) is not None
    clock.advance(29)
    p.apply_registry_snapshot([eng("d1", Role.DECODE, clock, heartbeat_at=clock.at(ago=68))])  # unchanged value
    assert p.choose("m", Role.DECODE) is not None
    clock.advance(2)
    p.apply_registry_snapshot([eng("d1", Role.DECODE, clock, heartbeat_at=clock.at(ago=70))])
    assert p.choose("m", Role.DECODE) is None


def test_zero_heartbeat_timeout_never_marks_stale(clock: Clock) -> None:
    p = pool_with(clock, eng("d1", Role.DECODE, clock, heartbeat_at=clock.at(ago=10_000)), timeout=0)
    assert p.choose("m", Role.DECODE) is not None


def test_generation_change_makes_older_handles_unreadable(clock: Clock) -> None:
    p = pool_with(clock, eng("d1", Role.DECODE, clock, generation=4))
    assert p.source_alive("d1", 4)
    assert not p.source_alive("d1", 3)
    assert p.source_alive("unknown-engine", 1)  # the registry's claim already checked it


def test_engines_of_other_models_and_without_urls_are_not_chosen(clock: Clock) -> None:
    p = pool_with(
        clock,
        eng("p-other", Role.PREFILL, clock, model="other"),
        eng("p-nourl", Role.PREFILL, clock, http_base_url=""),
    )
    assert p.choose("m", Role.PREFILL) is None
    reasons = {e.info.engine_id: e.unavailable_reason for e in p.entries(model="m")}
    assert reasons == {"p-nourl": "NO_HTTP_BASE_URL"}


def test_static_engines_take_precedence_and_follow_health(clock: Clock) -> None:
    p = pool_with(clock, eng("p-reg", Role.PREFILL, clock))
    p.set_static([parse_static("http://127.0.0.1:9001/", Role.PREFILL), parse_static("p2=http://127.0.0.1:9002", Role.PREFILL)])
    first = p.choose("any-model", Role.PREFILL)
    assert first is not None and first.source is Source.STATIC and first.engine_id == "http://127.0.0.1:9001"
    p.set_static_health("http://127.0.0.1:9001", False)
    second = p.choose("any-model", Role.PREFILL)
    assert second is not None and second.engine_id == "p2" and second.http_base_url == "http://127.0.0.1:9002"
    p.set_static_health("p2", False)
    assert p.choose("any-model", Role.PREFILL) is None  # static configured: no fallback
    with pytest.raises(ValueError):
        parse_static("p3=ftp://x", Role.DECODE)


def test_block_size_and_threshold_come_from_the_engines(clock: Clock) -> None:
    p = pool_with(
        clock,
        eng("d1", Role.DECODE, clock, block_size=32),
        eng("d2", Role.DECODE, clock, block_size=32),
        eng("d3", Role.DECODE, clock, block_size=16),
        eng("p1", Role.PREFILL, clock, kv_recompute_threshold=128),
    )
    assert p.block_size("m") == 32 and p.block_size("unknown") == 16
    p1 = p.choose("m", Role.PREFILL)
    assert p1 is not None and p.threshold(p1) == 128
    assert p.threshold(eng("p2", Role.PREFILL, clock)) == 64


def test_plan_ids_carry_their_time_and_claim_ids_follow_request_ids() -> None:
    pid = new_plan_id(1_800_000_000.123)
    assert plan_time(pid) == datetime(2027, 1, 15, 8, 0, 0, 123000, tzinfo=UTC)
    assert pid != new_plan_id(1_800_000_000.123)
    with pytest.raises(ValueError):
        plan_time("4c0e5a04-5d0e-4c1f-9a43-3c6f1d1c2b11")  # a UUIDv4
    assert claim_id_for("t", "", pid) == pid
    assert claim_id_for("t", "r1", pid) == claim_id_for("t", "r1", new_plan_id())
    assert claim_id_for("t", "r1", pid) != claim_id_for("u", "r1", pid)


def test_plan_store_evicts_by_age_and_size() -> None:
    from boomerang_router.domain import PlanDecision, PlanReason
    from boomerang_router.plan_store import PlanRecord

    now = [0.0]
    store = PlanStore(ttl=10, max_plans=100, clock=lambda: now[0])

    def rec(i: int) -> PlanRecord:
        pid = new_plan_id()
        return PlanRecord(pid, plan_time(pid), "t", "c", "m", f"r{i}", PlanDecision.COLD, PlanReason.NO_LEASE,
                          "p", "", "d", "", 10, 0, 10, 0, 64)

    first = rec(0)
    store.put(first)
    assert store.by_request("t", "r0") is first and store.get(first.plan_id) is first
    now[0] = 11
    evicted = store.put(rec(1))
    assert evicted == [first] and store.get(first.plan_id) is None and store.by_request("t", "r0") is None
    for i in range(2, 150):
        store.put(rec(i))
    assert len(store) == 100
