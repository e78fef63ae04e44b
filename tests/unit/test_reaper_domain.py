"""The reaper's pure rules: percentiles, the deadline tracker, clocks, lag, leadership."""

from __future__ import annotations

import random

import numpy as np
import pytest
from boomerang_reaper.advice import percentile
from boomerang_reaper.leader import ClockOffset, leadership_valid_until
from boomerang_reaper.metrics import LagSummary, LeaderStats, stats_from_json
from boomerang_reaper.worker import DeadlineTracker


@pytest.mark.parametrize("n", [1, 2, 7, 100])
def test_percentile_matches_numpy_linear(n: int) -> None:
    rng = random.Random(n)
    values = sorted(rng.uniform(0, 500) for _ in range(n))
    for q in (0, 1, 50, 90, 95, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_tracker_takes_hints_in_any_order() -> None:
    t = DeadlineTracker()
    assert t.earliest() is None
    assert t.hint(480.0) is True
    assert t.hint(600.0) is False  # later than what is known: no need to re-plan
    assert t.hint(2.0) is True  # a short TTL registered after a long one goes to the top
    assert t.earliest() == 2.0


def test_tracker_call_replaces_older_hints_and_keeps_those_in_flight() -> None:
    t = DeadlineTracker()
    t.hint(10.0)
    t.hint(20.0)
    token = t.begin_call()
    t.hint(15.0)  # arrived while the call was in flight: its lease may be newer than the call's view
    t.complete_call(token, next_deadline=30.0)
    assert t.earliest() == 15.0
    token = t.begin_call()
    t.complete_call(token, next_deadline=None)
    assert t.earliest() is None and len(t) == 0


def simulate(deadlines_in_arrival_order: list[tuple[float, float]]) -> dict[int, float]:
    """Drive a tracker against a fake registry: leases (registered_at, deadline) arrive in
    order; the reaper wakes at the tracker's earliest deadline or a new hint, and each call
    expires what is due and returns the next live deadline. Returns lease → expiry time."""
    live: dict[int, float] = {}
    expired: dict[int, float] = {}
    t = DeadlineTracker()
    arrivals = sorted(enumerate(deadlines_in_arrival_order), key=lambda x: x[1][0])
    now, i = 0.0, 0
    for _ in range(10_000):
        wake = t.earliest()
        next_arrival = arrivals[i][1][0] if i < len(arrivals) else None
        if wake is None and next_arrival is None:
            return expired
        if next_arrival is not None and (wake is None or next_arrival <= wake):
            idx, (now, deadline) = arrivals[i]
            i += 1
            live[idx] = deadline
            t.hint(deadline)
            continue
        assert wake is not None
        now = max(now, wake)
        token = t.begin_call()
        for idx, deadline in list(live.items()):
            if deadline <= now:
                expired[idx] = now
                del live[idx]
        t.complete_call(token, min(live.values()) if live else None)
    raise AssertionError("simulation did not settle")


def test_mixed_ttls_registered_longest_first_all_expire_at_their_deadline() -> None:
    # Registered one per second, TTL shrinking: every later lease is due before every earlier one.
    leases = [(float(k), float(k) + ttl) for k, ttl in enumerate([480, 240, 120, 60, 30, 10, 5, 2])]
    expired = simulate(leases)
    assert len(expired) == len(leases)
    for idx, (_, deadline) in enumerate(leases):
        assert expired[idx] == deadline  # not before, and no later than the deadline itself


def test_random_mixed_ttls_never_early_never_stranded() -> None:
    rng = random.Random(7)
    leases = []
    for k in range(300):
        registered = k * 0.1
        leases.append((registered, registered + rng.choice([1, 2, 5, 30, 480]) + rng.random()))
    expired = simulate(leases)
    assert set(expired) == set(range(len(leases)))
    for idx, (_, deadline) in enumerate(leases):
        assert expired[idx] == pytest.approx(deadline)


def test_clock_offset_prefers_the_tightest_round_trip() -> None:
    c = ClockOffset()
    with pytest.raises(RuntimeError):
        c.to_local(1.0)
    c.observe(db_epoch=1000.5, sent=10.0, received=11.0)  # rtt 1 s: offset 990 ± 0.5
    c.observe(db_epoch=1001.02, sent=11.0, received=11.04)  # rtt 40 ms: offset 990.0
    assert c.offset == pytest.approx(990.0)
    assert c.to_local(1005.0) == pytest.approx(15.0)
    assert c.db_now(20.0) == pytest.approx(1010.0)


def test_lag_summary_and_stats_round_trip() -> None:
    s = LeaderStats(window=3)
    s.record_expiries([0.1, 0.2], db_epoch=100.0)
    s.record_expiries([0.3, 0.9], db_epoch=101.0)
    assert s.expired == 4 and list(s.lags) == [0.2, 0.3, 0.9] and s.last_expire_epoch == 101.0
    lag = s.lag()
    assert lag == LagSummary(3, 0.3, pytest.approx(0.888), 0.9)
    again, lag_again = stats_from_json(s.to_json())
    assert again.expired == 4 and again.last_expire_epoch == 101.0
    assert lag_again == lag
    assert LagSummary.of([]) == LagSummary()


def test_leadership_ends_before_the_database_lease() -> None:
    assert leadership_valid_until(100.0, 2.0) == pytest.approx(101.9)
