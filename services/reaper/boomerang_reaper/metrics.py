"""The reaper's Prometheus metrics: expiry lag, what it ended, leadership and backlog.

Expiry lag is how long after its deadline (on the database clock) a lease was expired; the
registry measures it in the expiring statement and the reaper observes each one here.
Backlog (live leases past their deadline) and live leases are asked of the registry
(CountLiveLeases) every few seconds by any replica, so a standby's /metrics shows them too.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram

from boomerang_reaper.leader import LeaderElection
from boomerang_reaper.registry_api import ReaperRegistryClient

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


def observe_invalidated(n: int) -> None:
    """Record leases invalidated by an engine sweep."""
    if n:
        INVALIDATED.inc(n)


async def refresh_gauges(registry: ReaperRegistryClient, election: LeaderElection) -> None:
    """Leadership from this replica (read at each scrape); backlog and live leases from the registry."""
    LEADER.set_function(lambda: 1.0 if election.leader else 0.0)
    figures = await registry.count_live_leases()
    BACKLOG.set(figures.overdue_leases)
    LIVE.set(figures.live_leases)
