"""Per-tenant rate limits: a token bucket per tenant, refilled continuously.

A tenant may send `rate` requests per second on average and up to `burst` at once; past
that it gets HTTP 429 with `Retry-After`. One noisy tenant cannot starve the others of the
gateway, the control plane or the engines. Buckets of idle tenants are forgotten (a full
bucket holds no information), so memory stays bounded by the active tenants.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class TenantRateLimiter:
    """Token buckets keyed by tenant; `rate` ≤ 0 turns limiting off."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic, max_tenants: int = 100_000):
        self.rate = rate
        self.burst = max(1, burst)
        self.clock = clock
        self.max_tenants = max_tenants
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant → (tokens, at)

    @property
    def enabled(self) -> bool:
        """Whether any limit applies."""
        return self.rate > 0

    def acquire(self, tenant: str) -> float:
        """Take one request's token: 0.0 when allowed, else seconds until one is available."""
        if not self.enabled:
            return 0.0
        now = self.clock()
        tokens, at = self._buckets.get(tenant, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate)
        if tokens >= 1.0:
            self._buckets[tenant] = (tokens - 1.0, now)
            if len(self._buckets) > self.max_tenants:
                self._forget_full(now)
            return 0.0
        self._buckets[tenant] = (tokens, now)
        return (1.0 - tokens) / self.rate

    def _forget_full(self, now: float) -> None:
        full_after = self.burst / self.rate
        for tenant, (_, at) in list(self._buckets.items()):
            if now - at >= full_after:
                del self._buckets[tenant]


def retry_after_header(wait: float) -> dict[str, str]:
    """`Retry-After` in whole seconds (at least 1), as HTTP wants it."""
    return {"Retry-After": str(max(1, math.ceil(wait)))}
