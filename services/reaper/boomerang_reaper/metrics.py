"""The reaper's figures: its Prometheus metrics (expiry lag, what it ended, leadership and
backlog) and the leader's stats, published through its election row for any replica to report.

Expiry lag is how long after its deadline (on the database clock) a lease was expired; the
registry measures it in the expiring statement and the reaper observes each one here.
Backlog (live leases past their deadline) and live leases are asked of the registry
(CountLiveLeases) every few seconds by any replica, so a standby's /metrics shows them too.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from boomerang_reaper.advice import percentile

# Seconds: 1 ms … 2 min; the target is well under a second, a lost hint shows as tens.
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

EXPIRY_LAG = Histogram(
    "boomerang_reaper_expiry_lag_seconds",
    "Time from a lease's deadline to its expiry, on the database clock.",
    buckets=LAG_BUCKETS,
)
EXPIRED = Counter("boomerang_reaper_expired_leases", "Leases this replica expired as leader.")
INVALIDATED = Counter(
    "boomerang_reaper_invalidated_leases", "Leases this replica invalidated for engine liveness as leader."
)
RELEASED = Counter(
    "boomerang_reaper_released_leases",
    "Retained leases this replica released early as leader, by reason (RETENTION_POLICY, MEMORY_PRESSURE).",
    ["reason"],
)
LEADER = Gauge("boomerang_reaper_leader", "1 while this replica leads, else 0.")
BACKLOG = Gauge("boomerang_reaper_backlog_leases", "Live leases whose deadline has passed (not expired yet).")
LIVE = Gauge("boomerang_reaper_live_leases", "Live leases (RETAINED or CLAIMED).")


def observe_expiries(lags: Iterable[float]) -> None:
    """Record one ExpireLeases answer's lags."""
    n = 0
    for lag in lags:
        EXPIRY_LAG.observe(max(0.0, lag))
        n += 1
    if n:
        EXPIRED.inc(n)


@dataclass(frozen=True)
class LagSummary:
    """Percentiles of expiry lag (deadline to recorded expiry), in seconds."""

    count: int = 0
    p50: float = 0.0
    p99: float = 0.0
    max: float = 0.0

    @classmethod
    def of(cls, lags: Iterable[float]) -> LagSummary:
        """The summary of some lags."""
        ordered = sorted(lags)
        if not ordered:
            return cls()
        return cls(len(ordered), percentile(ordered, 50), percentile(ordered, 99), ordered[-1])


@dataclass
class LeaderStats:
    """What the leader did during its term; published through its election row."""

    window: int = 10_000
    expired: int = 0
    invalidated: int = 0
    dropped_partitions: int = 0
    last_expire_epoch: float | None = None
    lags: deque[float] = field(default_factory=deque)

    def record_expiries(self, lags: Sequence[float], db_epoch: float) -> None:
        """Count a call's expiries and remember their lags (the most recent `window`)."""
        if not lags:
            return
        self.expired += len(lags)
        self.last_expire_epoch = db_epoch
        self.lags.extend(lags)
        while len(self.lags) > self.window:
            self.lags.popleft()

    def lag(self) -> LagSummary:
        """The lag percentiles over the recent window."""
        return LagSummary.of(self.lags)

    def to_json(self) -> dict[str, Any]:
        """The form stored in `reaper_leader.stats`."""
        lag = self.lag()
        return {
            "expired": self.expired,
            "invalidated": self.invalidated,
            "dropped_partitions": self.dropped_partitions,
            "last_expire_epoch": self.last_expire_epoch,
            "lag": {"count": lag.count, "p50": lag.p50, "p99": lag.p99, "max": lag.max},
        }


def stats_from_json(data: dict[str, Any]) -> tuple[LeaderStats, LagSummary]:
    """Counters and lag summary from a published `reaper_leader.stats` value."""
    stats = LeaderStats(
        expired=int(data.get("expired", 0)),
        invalidated=int(data.get("invalidated", 0)),
        dropped_partitions=int(data.get("dropped_partitions", 0)),
        last_expire_epoch=data.get("last_expire_epoch"),
    )
    lag = data.get("lag") or {}
    return stats, LagSummary(
        int(lag.get("count", 0)), float(lag.get("p50", 0)), float(lag.get("p99", 0)), float(lag.get("max", 0))
    )
