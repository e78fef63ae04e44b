"""The shared resilience pieces: transient codes, the circuit breaker in each of its uses, back-off."""

from __future__ import annotations

import pytest
from boomerang.resilience import TRANSIENT_CODES, Backoff, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    "code", ["UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "INTERNAL", "UNKNOWN", "CANCELLED"]
)
def test_transient_codes(code: str) -> None:
    assert code in TRANSIENT_CODES


@pytest.mark.parametrize(
    "code", ["INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION", "PERMISSION_DENIED", "UNAUTHENTICATED",
             "ALREADY_EXISTS", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "DATA_LOSS", "OK", ""]
)
def test_refusals_of_the_request_are_not_transient(code: str) -> None:
    assert code not in TRANSIENT_CODES


def test_breaker_opens_after_failures_then_lets_one_probe_through() -> None:
    clock = Clock()
    b = CircuitBreaker(3, 1.0, clock=clock)
    for _ in range(2):
        b.record_failure()
        assert b.allow() and not b.is_open
    b.record_failure()
    assert b.is_open and not b.allow() and b.opened == 1
    clock.now = 1.01
    assert b.allow()  # the probe
    assert not b.allow()  # only one at a time
    b.record_failure()
    assert not b.allow() and b.opened == 1  # reopened, not opened anew
    clock.now = 2.0
    assert not b.allow()  # a fixed cooldown without growth: open until 2.01
    clock.now = 2.5
    assert b.allow()
    b.record_success()
    assert not b.is_open and b.allow() and b.allow()


def test_a_trial_that_never_reports_gets_another_after_a_cooldown() -> None:
    clock = Clock()
    b = CircuitBreaker(1, 1.0, clock=clock)
    b.record_failure()
    clock.now = 1.0
    assert b.allow() and not b.allow()
    clock.now = 2.0
    assert b.allow()  # the first trial was lost; the breaker does not stay shut for good


def test_breaker_with_zero_threshold_never_opens() -> None:
    b = CircuitBreaker(0, 1.0)
    for _ in range(100):
        b.record_failure()
    assert b.allow() and not b.is_open


def test_growing_cooldown_doubles_to_its_cap_and_resets_on_success() -> None:
    clock = Clock()
    b = CircuitBreaker(1, 1.0, growth=2.0, max_cooldown=3.0, clock=clock)
    b.record_failure()  # open until 1
    for now, cooldown in ((1.0, 2.0), (3.0, 3.0), (6.0, 3.0)):
        clock.now = now
        assert b.allow()
        b.record_failure()
        assert b.cooldown == cooldown and b.open_until == now + cooldown
    b.record_success()
    assert b.cooldown == 1.0 and b.allow()


def test_calls_in_flight_when_it_opened_that_fail_after_do_not_lengthen_the_pause() -> None:
    """The vLLM hook's case: eight plans to a hung router all time out together."""
    clock = Clock()
    b = CircuitBreaker(3, 0.5, growth=2.0, max_cooldown=30.0, clock=clock)
    for _ in range(8):
        b.record_failure()
    assert b.cooldown == 0.5 and b.open_until == 0.5 and not b.allow()
    clock.now = 0.5
    assert b.allow()  # the trial, half a second on
    b.record_failure()
    assert b.cooldown == 1.0 and b.open_until == 1.5  # a failed trial doubles the pause


def test_without_one_trial_every_caller_goes_once_the_pause_is_over() -> None:
    """The gateway's use: a tripped breaker pauses every turn's router call for the back-off."""
    clock = Clock()
    b = CircuitBreaker(3, 5.0, one_trial=False, clock=clock)
    assert b.allow()
    b.trip()  # unreachable: open now, not after three
    assert b.is_open and b.opened == 1
    clock.now = 4.9
    assert not b.allow()
    clock.now = 5.0
    assert b.allow() and b.allow() and b.allow()
    b.record_failure()  # a failure after the pause starts a new one
    assert not b.allow()


def test_trip_opens_at_once_and_a_disabled_breaker_ignores_it() -> None:
    b = CircuitBreaker(5, 10.0)
    b.trip()
    assert not b.allow() and b.consecutive == 5
    off = CircuitBreaker(0, 10.0)
    off.trip()
    assert off.allow() and not off.is_open


def test_zero_cooldown_never_refuses() -> None:
    b = CircuitBreaker(1, 0.0, one_trial=False)
    b.record_failure()
    assert b.allow()


def test_backoff_doubles_to_its_cap_and_resets() -> None:
    b = Backoff(0.05, 0.3)
    assert [b.next() for _ in range(5)] == [0.05, 0.1, 0.2, 0.3, 0.3]
    b.reset()
    assert b.next() == 0.05
