"""Leader election over one Postgres row: exactly one reaper replica acts at a time.

Every replica tries `ReaperRepository.acquire` in a loop. The holder renews every third of
the lease and may act until `leadership_valid_until` on its own monotonic clock (counted
from when it sent the renewal, so a pause or a slow round trip only shortens it). The
others sleep until the holder's lapse instant (from the row, mapped through the measured
clock offset) and try then, so when a leader dies without notice another takes over about
one lease after its last renewal; on SIGTERM the leader releases the row and a standby
takes over at its next attempt. The term is the fencing token: the registry refuses
writes from any other term, so a leader that was paused past its lease cannot do harm.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from boomerang_reaper.domain import ClockOffset, leadership_valid_until
from boomerang_reaper.repository import LeaderRow, ReaperRepository

log = logging.getLogger(__name__)


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
