"""Per-tenant token buckets."""

from __future__ import annotations

from boomerang_gateway.tenants import TenantRateLimiter, retry_after_header


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_burst_then_steady_rate_per_tenant() -> None:
    clock = Clock()
    limiter = TenantRateLimiter(rate=2.0, burst=3, clock=clock)
    assert [limiter.acquire("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = limiter.acquire("a")
    assert wait == 0.5  # one token refills in 1/rate seconds
    assert limiter.acquire("b") == 0.0  # another tenant is untouched
    clock.now += 0.5
    assert limiter.acquire("a") == 0.0
    assert limiter.acquire("a") > 0


def test_off_when_rate_is_zero() -> None:
    limiter = TenantRateLimiter(rate=0, burst=1)
    assert not limiter.enabled
    assert all(limiter.acquire("a") == 0.0 for _ in range(1000))


def test_idle_tenants_are_forgotten() -> None:
    clock = Clock()
    limiter = TenantRateLimiter(rate=10.0, burst=1, clock=clock, max_tenants=10)
    for i in range(10):
        limiter.acquire(f"t{i}")
    clock.now += 1.0  # every bucket is full again
    limiter.acquire("new")
    assert len(limiter._buckets) <= 2


def test_retry_after_is_whole_seconds() -> None:
    assert retry_after_header(0.2) == {"Retry-After": "1"}
    assert retry_after_header(2.1) == {"Retry-After": "3"}
