"""Leader election over one Postgres row: exactly one reaper replica acts at a time.

Every replica tries `ReaperRepository.acquire` (the election's row in `reaper_leader`, the
reaper's own table; lease state it reads and changes through the registry's RPCs only) in a
loop. The holder renews every third of the lease and may act until `leadership_valid_until`
on its own monotonic clock (counted from when it sent the renewal, so a pause or a slow
round trip only shortens it). The others sleep until the holder's lapse instant (from the
row, mapped through the measured clock offset) and try then, so when a leader dies without
notice another takes over about one lease after its last renewal; on SIGTERM the leader
releases the row and a standby takes over at its next attempt. The term is the fencing
token: the registry refuses writes from any other term, so a leader that was paused past its
lease cannot do harm.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger(__name__)

# Take the row when it is free, lapsed, or ours; keep the term while we hold it unbroken
# and start a new one on every change of hands (or when our own lease had lapsed, so any
# write still in flight from the old term is refused). A concurrent contender waits on the
# row lock and then sees the winner's unexpired lease: exactly one wins.
ACQUIRE_SQL = """
INSERT INTO reaper_leader AS r (election, holder, term, acquired_at, renewed_at, expires_at, stats)
VALUES (:election, :holder, 1, now(), now(), now() + make_interval(secs => CAST(:lease AS float8)),
        CAST(:stats AS jsonb))
ON CONFLICT (election) DO UPDATE SET
    term = CASE WHEN r.holder = EXCLUDED.holder AND r.expires_at > now() THEN r.term ELSE r.term + 1 END,
    acquired_at = CASE WHEN r.holder = EXCLUDED.holder AND r.expires_at > now()
                       THEN r.acquired_at ELSE now() END,
    holder = EXCLUDED.holder, renewed_at = now(), expires_at = EXCLUDED.expires_at,
    stats = EXCLUDED.stats
WHERE r.holder = EXCLUDED.holder OR r.expires_at <= now()
RETURNING r.holder, r.term, r.expires_at, EXTRACT(EPOCH FROM now())::float8 AS db_now
"""

CURRENT_SQL = """
SELECT holder, term, expires_at, stats, EXTRACT(EPOCH FROM now())::float8 AS db_now
FROM reaper_leader WHERE election = :election
"""

RELEASE_SQL = """
UPDATE reaper_leader SET expires_at = now(), renewed_at = now(), stats = CAST(:stats AS jsonb)
WHERE election = :election AND holder = :holder AND term = :term AND expires_at > now()
"""


@dataclass(frozen=True)
class LeaderRow:
    """The election row as one round trip saw it (db_now in epoch seconds)."""

    holder: str
    term: int
    expires_at: datetime
    db_now: float
    stats: dict[str, Any]

    @property
    def expires_epoch(self) -> float:
        """The lapse instant in epoch seconds."""
        return self.expires_at.timestamp()

    @property
    def unexpired(self) -> bool:
        """Whether the holder's lease had not lapsed at `db_now`."""
        return self.expires_epoch > self.db_now


class ReaperRepository:
    """Postgres access for the reaper."""

    def __init__(self, engine: AsyncEngine):
        self.engine = engine

    async def acquire(self, election: str, holder: str, lease_seconds: float, stats: dict[str, Any]) -> tuple[bool, LeaderRow | None]:
        """Take or renew leadership; (whether we hold it, the row as it stands)."""
        params = {"election": election, "holder": holder, "lease": lease_seconds, "stats": json.dumps(stats)}
        async with self.engine.begin() as conn:
            row = (await conn.execute(text(ACQUIRE_SQL), params)).first()
            if row is not None:
                return True, LeaderRow(row.holder, row.term, row.expires_at, row.db_now, stats)
            current = (await conn.execute(text(CURRENT_SQL), {"election": election})).first()
        return False, _leader_row(current)

    async def current(self, election: str) -> LeaderRow | None:
        """The election row, if anyone was ever elected."""
        async with self.engine.connect() as conn:
            return _leader_row((await conn.execute(text(CURRENT_SQL), {"election": election})).first())

    async def release(self, election: str, holder: str, term: int, stats: dict[str, Any]) -> bool:
        """Give up leadership at once (on shutdown) so a standby need not wait for the lapse."""
        params = {"election": election, "holder": holder, "term": term, "stats": json.dumps(stats)}
        async with self.engine.begin() as conn:
            return (await conn.execute(text(RELEASE_SQL), params)).rowcount == 1


def _leader_row(row: Any) -> LeaderRow | None:
    if row is None:
        return None
    return LeaderRow(row.holder, row.term, row.expires_at, row.db_now, dict(row.stats or {}))


# Deadlines are instants on the database clock (epoch seconds). The reaper sleeps on its own
# monotonic clock, so it maps one onto the other with an offset measured on every round
# trip to the database or the registry. Waking a little early is harmless (the expiry is
# decided in SQL against the database's `now()`, so nothing expires before its deadline);
# waking late is lag, and the offset keeps it to about half a round trip.
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


def leadership_valid_until(sent_local: float, lease_seconds: float) -> float:
    """The local instant up to which a just-renewed leader may act.

    The database started the lease no earlier than the request was sent, so counting from
    `sent_local` is safe; a twentieth of the lease is kept back for clock-rate differences.
    """
    return sent_local + lease_seconds * 0.95




class LeaderElection:
    """Keeps trying to lead; tells the worker when it does and when it stops."""

    def __init__(
        self,
        repo: ReaperRepository,
        election: str,
        replica_id: str,
        lease_seconds: float,
        clock: ClockOffset,
        stats: Callable[[], dict[str, Any]],
    ):
        self.repo = repo
        self.election = election
        self.replica_id = replica_id
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.stats = stats
        self.term = 0  # the term this replica holds (0: none)
        self.valid_until = 0.0  # local monotonic
        self.changed = asyncio.Event()  # set on every gain or loss of leadership
        self._kick = asyncio.Event()
        self._loop = asyncio.get_running_loop()

    @property
    def renew_interval(self) -> float:
        """Seconds between renewals."""
        return self.lease_seconds / 3

    def holds(self, term: int) -> bool:
        """Whether this replica may act under `term` right now."""
        return term != 0 and self.term == term and self._loop.time() < self.valid_until

    @property
    def leader(self) -> bool:
        """Whether this replica may act right now."""
        return self.holds(self.term)

    def lost(self, term: int, why: str) -> None:
        """The registry refused `term` (fenced): stop acting and re-run the election now."""
        if self.term == term and term:
            log.warning("leadership term %d lost: %s", term, why)
            self._set_term(0)
            self._kick.set()

    async def wait_for_leadership(self) -> int:
        """Return the term once this replica leads."""
        while not self.leader:
            self.changed.clear()
            await self.changed.wait()
        return self.term

    async def run(self) -> None:
        """The election loop (until cancelled)."""
        while True:
            delay = await self._attempt()
            self._kick.clear()
            try:
                await asyncio.wait_for(self._kick.wait(), timeout=max(0.01, delay))
            except TimeoutError:
                pass

    async def release(self) -> None:
        """Give leadership up (on shutdown)."""
        term = self.term
        self._set_term(0)
        if term:
            try:
                await asyncio.wait_for(self.repo.release(self.election, self.replica_id, term, self.stats()), 2.0)
                log.info("released leadership term %d", term)
            except Exception:
                log.warning("could not release leadership term %d", term, exc_info=True)

    async def _attempt(self) -> float:
        """One acquire-or-renew round trip; returns the seconds until the next one."""
        sent = self._loop.time()
        try:
            won, row = await asyncio.wait_for(
                self.repo.acquire(self.election, self.replica_id, self.lease_seconds, self.stats()),
                timeout=self.renew_interval,
            )
        except Exception as exc:  # noqa: BLE001 - the database may be away; keep trying
            log.warning("leader election round failed: %s", exc)
            if self.term and self._loop.time() >= self.valid_until:
                self._set_term(0)
            return min(self.renew_interval, 1.0)
        received = self._loop.time()
        if row is not None:
            self.clock.observe(row.db_now, sent, received)
        if won and row is not None:
            self.valid_until = leadership_valid_until(sent, self.lease_seconds)
            if row.term != self.term:
                log.info("leading as %s with term %d", self.replica_id, row.term)
                self._set_term(row.term)
            return self.renew_interval
        if self.term:
            self._set_term(0)
        return self._until_lapse(row, received)

    def _until_lapse(self, row: LeaderRow | None, now: float) -> float:
        # Try again just after the holder's lease lapses, but at least every renew interval
        # (the holder may release early on shutdown).
        if row is None or not row.unexpired:
            return 0.01
        lapse_local = self.clock.to_local(row.expires_epoch) + 0.005
        return max(0.005, min(self.renew_interval, lapse_local - now))

    def _set_term(self, term: int) -> None:
        if term != self.term:
            self.term = term
            if not term:
                self.valid_until = 0.0
            self.changed.set()
