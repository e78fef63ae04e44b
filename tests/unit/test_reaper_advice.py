"""TTL advice as pure computation: pairing turns, pauses, reuse, memory, recommendation."""

from __future__ import annotations

import pytest
from boomerang.errors import BoomerangError
from boomerang_reaper.advice import (
    DEFAULT_CANDIDATES,
    Observation,
    Pause,
    TurnRecord,
    advise,
    evaluate,
    make_query,
    observe,
    shortest_ttl,
)
from boomerang_reaper.cli import render_table, to_json


def turn(conv: str, finished: float, claimed: float | None = None, state: str = "CONSUMED", blocks: int = 10,
         model: str = "m", tenant: str = "t", bpb: int = 0, ttl: int = 480) -> TurnRecord:
    return TurnRecord(tenant, model, conv, f"{conv}@{finished}", finished, blocks, bpb, ttl, claimed, state)


def test_pairing_exact_bounded_and_last_turns() -> None:
    records = [
        turn("a", 100.0, state="RETAINED"),  # last turn: no next turn yet
        turn("a", 0.0, claimed=10.0),  # the next turn claimed it 10 s after it ended
        turn("a", 20.0, state="EXPIRED"),  # found nothing; the next turn ended at 100
        turn("b", 0.0, state="SUPERSEDED"),  # the next turn came in time but did not read
        turn("b", 5.0, state="RETAINED"),
    ]
    by_lease = {o.record.lease_id: o.pause for o in observe(records)}
    assert by_lease["a@0.0"] == Pause(10.0, exact=True, reader=True)
    assert by_lease["a@20.0"] == Pause(80.0, exact=False, reader=True)
    assert by_lease["a@100.0"] is None
    assert by_lease["b@0.0"] == Pause(5.0, exact=False, reader=False)


@pytest.mark.parametrize(
    ("pauses", "target", "safety", "expected"),
    [
        (list(range(1, 21)), 0.95, 0.0, 20),  # 19 of 20 pauses < 20 s; 0.95 × 20 must not round up to 20
        (list(range(1, 21)), 0.95, 15.0, 35),  # pause < TTL − safety, strictly
        (list(range(1, 21)), 1.0, 0.0, 21),
        ([0.5, 2.25], 0.5, 0.0, 1),
        ([12.7], 0.95, 10.0, 23),
        ([], 0.95, 15.0, 0),
    ],
)
def test_shortest_ttl(pauses: list[float], target: float, safety: float, expected: int) -> None:
    ttl = shortest_ttl(pauses, target, safety)
    assert ttl == expected
    if pauses:  # it reaches the target, and one second less does not
        assert sum(p < ttl - safety for p in pauses) >= target * len(pauses) - 1e-9
        assert sum(p < ttl - 1 - safety for p in pauses) < target * len(pauses) - 1e-9


def test_memory_counts_held_time_until_read_or_ttl() -> None:
    read = Observation(turn("a", 0.0, claimed=30.0, bpb=100), Pause(30.0, exact=True, reader=True))
    last = Observation(turn("b", 0.0, blocks=4), None)
    unread = Observation(turn("c", 0.0, blocks=2, state="SUPERSEDED"), Pause(5.0, exact=False, reader=False))
    at60 = evaluate([read, last, unread], ttl=60, safety=0.0, span_seconds=100.0)
    assert at60.reuse_share == 1.0  # both next turns came within 60 s
    assert at60.block_seconds == 10 * 30 + 4 * 60 + 2 * 60  # read frees at 30 s; the others hold the TTL
    assert at60.byte_seconds == 10 * 30 * 100
    assert at60.mean_resident_blocks == pytest.approx(at60.block_seconds / 100.0)
    at20 = evaluate([read, last, unread], ttl=20, safety=0.0, span_seconds=100.0)
    assert at20.reuse_share == 0.5 and at20.block_seconds == 10 * 20 + 4 * 20 + 2 * 20


def test_advice_per_tenant_and_model_with_recommendation_and_current() -> None:
    records = []
    for i in range(20):  # pauses 1..20 s, exact
        records.append(turn(f"c{i}", 0.0, claimed=float(i + 1), ttl=480, bpb=1 << 20))
        records.append(turn(f"c{i}", float(i + 1) + 3.0, state="RETAINED", ttl=480, bpb=1 << 20))
    records.append(turn("other", 0.0, tenant="u", model="x"))
    advice = advise(records, target=0.95, safety=0.0, candidates=(10, 60))
    assert [(a.tenant, a.model) for a in advice] == [("t", "m"), ("u", "x")]
    a = advice[0]
    assert (a.turns, a.next_turns, a.exact_pauses) == (40, 20, 20)
    assert dict(a.pause_percentiles) == {50.0: 10.5, 90.0: pytest.approx(18.1), 95.0: pytest.approx(19.05),
                                         99.0: pytest.approx(19.81), 100.0: 20.0}
    assert a.recommended_ttl_seconds == 20 and a.current_ttl_seconds == 480
    assert [c.ttl_seconds for c in a.candidates] == [10, 20, 60, 480]
    rec = next(c for c in a.candidates if c.recommended)
    assert rec.ttl_seconds == 20 and rec.reuse_share == 0.95
    assert next(c for c in a.candidates if c.current).ttl_seconds == 480
    assert a.bytes_known_share == 1.0
    lonely = advice[1]
    assert lonely.next_turns == 0 and lonely.recommended_ttl_seconds == 0 and lonely.pause_percentiles == []
    assert lonely.bytes_known_share == 0.0


def test_model_filter_applies_after_pairing() -> None:
    records = [turn("c", 0.0, model="m1", state="EXPIRED"), turn("c", 50.0, model="m2", state="RETAINED")]
    (only,) = advise(records, model="m1", safety=0.0)
    assert only.model == "m1" and only.next_turns == 1 and only.pause_percentiles[0] == (50.0, 50.0)


def test_reports() -> None:
    records = [turn("c", 0.0, claimed=12.0, bpb=2 << 20), turn("c", 20.0, state="RETAINED", bpb=2 << 20)]
    advice = advise(records, target=0.95, safety=10.0, candidates=DEFAULT_CANDIDATES)
    text = render_table(advice, 0.95, 10.0)
    assert "recommendation: decoder_kv_blocks_ttl = 23 s" in text
    assert "pause before the next turn: p50 12.0 s" in text and "MiB" in text
    doc = to_json(advice, 0.95, 10.0, {"start": "s", "end": "e"})
    entry = doc["advice"][0]
    assert entry["recommended_ttl_seconds"] == 23 and entry["pause_seconds"]["p50"] == 12.0
    assert entry["pause_seconds"]["max"] == 12.0
    assert [c["ttl_seconds"] for c in entry["candidates"] if c["recommended"]] == [23]
    assert render_table([], 0.95, 10.0).startswith("no finished turns")


def test_query_validation_names_each_field() -> None:
    with pytest.raises(BoomerangError) as err:
        make_query(tenant="a b", target=1.5, history_hours=-1, candidates=(0, 60), safety_seconds=-2)
    fields = {v.field for v in err.value.violations}
    assert fields == {"tenant", "target_reuse", "history_hours", "candidate_ttl_seconds[0]", "safety_seconds"}
    q = make_query()
    assert (q.target, q.history_hours, q.safety_seconds, q.candidates) == (0.95, 168.0, 15.0, DEFAULT_CANDIDATES)
    assert make_query(safety_seconds=0.0).safety_seconds == 0.0


def test_advice_survives_the_wire() -> None:
    from boomerang_reaper.advice import advice_from_proto, advice_to_proto

    records = [turn("c", 0.0, claimed=12.0, bpb=1024), turn("c", 20.0, state="RETAINED", bpb=1024)]
    for a in advise(records, target=0.9, safety=3.0, candidates=(10, 60)):
        assert advice_from_proto(advice_to_proto(a)) == a
