"""The reaper's rules, free of gRPC and SQL: when to wake, how clocks map, what lag was.

Deadlines are instants on the database clock (epoch seconds). The reaper sleeps on its own
monotonic clock, so it maps one onto the other with an offset measured on every round
trip to the database or the registry. Waking a little early is harmless (the expiry is
decided in SQL against the database's `now()`, so nothing expires before its deadline);
waking late is lag, and the offset keeps it to about half a round trip.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-th percentile (0 to 100) of ascending values, interpolating linearly between
    the two nearest ranks (as numpy's default and Postgres' `percentile_cont` do)."""
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be 0 to 100, got {q}")
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class DeadlineTracker:
    """A min-heap of the deadlines the leader knows of; its top is when to call ExpireLeases.

    Hints come from the registry's deadline watch in any order (a 2 s lease registered after
    a 480 s one goes to the top; nothing assumes arrival in deadline order). Each
    ExpireLeases call answers with the exact earliest deadline still live, computed after
    it expired what was due, which covers every lease committed before the call began. So
    when a call completes, every hint received before it began is replaced by that one
    answer; hints received while the call was in flight are kept, since their leases may
    have committed after the call looked. The heap therefore never holds more than one
    entry per hint since the last call, and a lease that ended early costs at most one
    wake-up that expires nothing.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        self._seq = itertools.count()
        self._last_seq = -1

    def __len__(self) -> int:
        return len(self._heap)

    def hint(self, deadline: float) -> bool:
        """Add a deadline; True when it became the earliest (the sleeper should re-plan)."""
        seq = next(self._seq)
        self._last_seq = seq
        earliest = self.earliest()
        heapq.heappush(self._heap, (deadline, seq))
        return earliest is None or deadline < earliest

    def earliest(self) -> float | None:
        """The earliest known deadline, or None when nothing is known to be live."""
        return self._heap[0][0] if self._heap else None

    def begin_call(self) -> int:
        """Mark the start of an ExpireLeases call; pass the token to `complete_call`."""
        return self._last_seq + 1

    def complete_call(self, token: int, next_deadline: float | None) -> None:
        """Replace every hint older than `token` by the call's `next_deadline`."""
        kept = [entry for entry in self._heap if entry[1] >= token]
        if next_deadline is not None:
            kept.append((next_deadline, token - 1))
        heapq.heapify(kept)
        self._heap = kept


class ClockOffset:
    """Maps database-clock instants onto this process's monotonic clock.

    Each sample is a database timestamp read during a round trip that started at local
    `sent` and ended at `received`; the database read it at some local instant between,
    so the midpoint errs by at most half the round trip. The sample with the smallest round
    trip among the recent ones wins.
    """

    def __init__(self, window: int = 8) -> None:
        self._samples: deque[tuple[float, float]] = deque(maxlen=window)  # (rtt, offset)
        self.offset: float | None = None

    def observe(self, db_epoch: float, sent: float, received: float) -> None:
        """Record one round trip's database time."""
        rtt = max(0.0, received - sent)
        self._samples.append((rtt, db_epoch - (sent + received) / 2.0))
        self.offset = min(self._samples)[1]

    def to_local(self, db_epoch: float) -> float:
        """The local monotonic instant of a database instant (needs one sample first; the
        election takes one before anyone can lead)."""
        if self.offset is None:
            raise RuntimeError("no database clock sample yet")
        return db_epoch - self.offset

    def db_now(self, local_now: float) -> float | None:
        """The database clock now, as best known."""
        return None if self.offset is None else local_now + self.offset


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


def leadership_valid_until(sent_local: float, lease_seconds: float) -> float:
    """The local instant up to which a just-renewed leader may act.

    The database started the lease no earlier than the request was sent, so counting from
    `sent_local` is safe; a twentieth of the lease is kept back for clock-rate differences.
    """
    return sent_local + lease_seconds * 0.95
