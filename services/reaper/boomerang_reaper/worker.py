"""The leader's work: expire leases at their deadlines, sweep engine liveness, keep the
audit partitions, release retained turns nobody will likely pull (retainer.py), all through
the registry's fenced RPCs.

While it leads, the replica watches the registry's deadline hints and sleeps until the
earliest known deadline (or the next sweep or retention run), never polling on a short
fixed interval. Every ExpireLeases call drains what is due and answers with the next
deadline, so the tracker always knows when to wake next. `coalesce_seconds` bounds the
call rate when deadlines crowd together; `max_sleep_seconds` is a backstop should a hint
ever be lost. A FENCED answer means another replica leads now: stop at once.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
from dataclasses import dataclass, field

from boomerang.clients.base import BoomerangClientError
from boomerang.v1 import registry_service_pb2 as rpb

from boomerang_reaper import metrics
from boomerang_reaper.leader import ClockOffset, LeaderElection
from boomerang_reaper.metrics import LeaderStats
from boomerang_reaper.registry_client import ReaperRegistryClient, epoch
from boomerang_reaper.retainer import Retainer
from boomerang_reaper.settings import ReaperSettings

log = logging.getLogger(__name__)
BUSY_RETRY_SECONDS = 0.02  # a due lease was locked by another transaction: look again soon
ERROR_RETRY_SECONDS = (0.1, 0.25, 0.5, 1.0, 2.0)
# A retention pass reads every retained lease (ListLeases, 1,000 a page): with 100,000 of them
# it costs the registry seconds of CPU. It runs beside the expiry loop, never in it, and the
# next pass waits at least this many times as long as the last one took, so the passes use at
# most 1/(1 + RELEASE_PAUSE_FACTOR) of the time (5%) whatever the number of leases.
RELEASE_PAUSE_FACTOR = 19.0


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


class NotLeader(Exception):
    """This replica does not lead (the servicer names who does, from the election row)."""


@dataclass
class ReapResult:
    """What one ReapNow did."""

    term: int
    lags: list[float] = field(default_factory=list)
    invalidated: int = 0
    dead_engine_ids: list[str] = field(default_factory=list)
    dropped_partitions: list[str] = field(default_factory=list)


class Reaper:
    """Runs the leader's work whenever the election says this replica leads."""

    def __init__(
        self,
        settings: ReaperSettings,
        registry: ReaperRegistryClient,
        election: LeaderElection,
        clock: ClockOffset,
        replica_id: str,
        retainer: Retainer | None = None,
    ):
        self.settings = settings
        self.registry = registry
        self.election = election
        self.clock = clock
        self.actor = f"reaper:{replica_id}"[:128]
        self.replica_id = replica_id
        self.retainer = retainer  # None: no early releases (release_interval_seconds 0)
        self.stats = LeaderStats()
        self.tracker = DeadlineTracker()
        self._wake = asyncio.Event()
        self._next_release = math.inf  # when the next retention pass may start (loop time)
        self._work = asyncio.Lock()  # one registry job at a time (the loop and ReapNow)
        self._loop = asyncio.get_running_loop()
        # Heartbeats are recorded through the registry and Postgres: while this leader could not
        # reach them, neither could the engines, so a heartbeat's age says nothing until they have
        # had a whole timeout to be heard again (a Postgres failover, or a new leader that does not
        # know what it missed). Loop time since which the registry has answered.
        self._heard_since = self._loop.time()
        self._deaf = False

    def fence(self, term: int) -> rpb.ReaperFence:
        """The fencing token for `term`."""
        return rpb.ReaperFence(election=self.settings.election, term=term)

    async def run(self) -> None:
        """Lead whenever elected (until cancelled)."""
        while True:
            term = await self.election.wait_for_leadership()
            self.stats = LeaderStats()
            self.tracker = DeadlineTracker()
            log.info("term %d: reaping", term)
            try:
                await self._lead(term)
            except Exception:
                log.exception("term %d: the reaping loop failed; restarting it", term)
                await asyncio.sleep(1.0)
            log.info("term %d: no longer leading", term)

    async def _lead(self, term: int) -> None:
        watch = asyncio.create_task(self._watch(), name="deadline-watch")
        s = self.settings
        now = self._loop.time()
        self._heard_since = now
        last_call, retry_at = -math.inf, now  # expire at once: catch up on what fell due
        next_sweep, next_retention = now, now
        # The first pass waits one interval: the leases' state settles after a failover.
        self._next_release = now + s.release_interval_seconds if self.retainer is not None else math.inf
        releasing: asyncio.Task[None] | None = None
        failures = 0
        try:
            while self.election.holds(term):
                now = self._loop.time()
                if now >= self._next_release and (releasing is None or releasing.done()):
                    self._next_release = math.inf  # the pass sets the next one when it ends
                    releasing = asyncio.create_task(self._release_pass(term), name="retention-pass")
                expire_at = max(self._expire_at(last_call), retry_at)
                job = "expire" if now >= expire_at else "sweep" if now >= next_sweep else (
                    "retention" if now >= next_retention else "")
                if not job:
                    wake = min(expire_at, next_sweep, next_retention, self._next_release, self.election.valid_until)
                    await self._sleep(wake - now)
                    continue
                try:
                    if job == "expire":
                        await self.expire_due(term)
                        last_call = self._loop.time()
                    elif job == "sweep":
                        await self.sweep_engines(term)
                        next_sweep = now + s.engine_sweep_interval_seconds
                    else:
                        await self.enforce_retention(term)
                        next_retention = now + s.retention_interval_seconds
                    failures = 0
                    if self._deaf:
                        self._deaf, self._heard_since = False, self._loop.time()
                except BoomerangClientError as err:
                    if err.reason == "FENCED":
                        self.election.lost(term, err.error.message)
                        break
                    self._deaf = True
                    delay = ERROR_RETRY_SECONDS[min(failures, len(ERROR_RETRY_SECONDS) - 1)]
                    failures += 1
                    log.warning("%s failed (retrying in %.2fs): %s", job, delay, err)
                    if job == "expire":
                        retry_at = now + delay
                    elif job == "sweep":
                        next_sweep = now + delay
                    else:
                        next_retention = now + delay
        finally:
            watch.cancel()
            if releasing is not None:
                releasing.cancel()
            await asyncio.gather(watch, *([releasing] if releasing else []), return_exceptions=True)

    async def _release_pass(self, term: int) -> None:
        """One retention pass beside the expiry loop; sets when the next one may start."""
        started = self._loop.time()
        pause = self.settings.release_interval_seconds
        try:
            await self.release_unlikely(term)
        except BoomerangClientError as err:
            if err.reason == "FENCED":
                self.election.lost(term, err.error.message)
                return
            log.warning("release failed (retrying in %.2fs): %s", pause, err)
        except Exception:  # the pass must not take the leader's loop down with it
            log.exception("term %d: the retention pass failed", term)
        took = self._loop.time() - started
        self._next_release = self._loop.time() + max(pause, RELEASE_PAUSE_FACTOR * took)
        self._wake.set()

    def _expire_at(self, last_call: float) -> float:
        """The local instant of the next ExpireLeases call."""
        due = last_call + self.settings.max_sleep_seconds
        earliest = self.tracker.earliest()
        if earliest is not None:
            due = min(due, self.clock.to_local(earliest))
        return max(due, last_call + self.settings.coalesce_seconds)

    async def _sleep(self, seconds: float) -> None:
        self._wake.clear()
        if seconds <= 0:
            return
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)
        except TimeoutError:
            pass

    async def _watch(self) -> None:
        """Feed the registry's deadline hints into the tracker, reconnecting as needed."""
        failures = 0
        while True:
            try:
                async for msg in self.registry.watch_lease_deadlines(self.replica_id):
                    failures = 0
                    if msg.HasField("earliest_expire_time") and self.tracker.hint(epoch(msg.earliest_expire_time)):
                        self._wake.set()
                log.info("deadline watch ended; reconnecting")
            except BoomerangClientError as err:
                log.info("deadline watch ended (%s); reconnecting", err)
            except Exception:
                log.warning("deadline watch failed; reconnecting", exc_info=True)
            await asyncio.sleep(ERROR_RETRY_SECONDS[min(failures, len(ERROR_RETRY_SECONDS) - 1)])
            failures += 1

    async def expire_due(self, term: int, request_id: str = "") -> list[float]:
        """Expire everything due under `term`; returns the lags of the leases expired."""
        lags: list[float] = []
        async with self._work:
            while self.election.holds(term):
                token = self.tracker.begin_call()
                sent = self._loop.time()
                resp = await self.registry.expire_leases(
                    rpb.ExpireLeasesRequest(
                        fence=self.fence(term),
                        max_leases=self.settings.expire_batch_size,
                        actor=self.actor,
                        request_id=request_id,
                    ),
                    timeout=self.settings.registry_timeout_seconds,
                )
                db_now = epoch(resp.database_time)
                self.clock.observe(db_now, sent, self._loop.time())
                nxt = epoch(resp.next_expire_time) if resp.HasField("next_expire_time") else None
                if nxt is not None and nxt <= db_now and not resp.more_due:
                    nxt = db_now + BUSY_RETRY_SECONDS
                self.tracker.complete_call(token, nxt)
                batch = [e.lag_seconds for e in resp.expired_leases]
                self.stats.record_expiries(batch, db_now)
                metrics.observe_expiries(batch)
                lags.extend(batch)
                if batch:
                    log.info("term %d: expired %d lease(s), max lag %.3fs", term, len(batch), max(batch))
                if not resp.more_due:
                    break
        return lags

    def heartbeat_timeout(self) -> float:
        """The heartbeat age past which an engine is silent now: the setting, lengthened until the
        engines have had one whole timeout to be heard since the registry last answered again."""
        timeout = self.settings.engine_heartbeat_timeout_seconds
        if timeout <= 0:
            return timeout
        return min(86400.0, timeout + max(0.0, self._heard_since + timeout - self._loop.time()))

    async def sweep_engines(self, term: int, request_id: str = "") -> tuple[int, list[str]]:
        """Invalidate the leases of silent, dead and restarted engines under `term`."""
        async with self._work:
            resp = await self.registry.sweep_engines(
                rpb.SweepEnginesRequest(
                    fence=self.fence(term),
                    heartbeat_timeout_seconds=self.heartbeat_timeout(),
                    actor=self.actor,
                    request_id=request_id,
                ),
                timeout=self.settings.registry_timeout_seconds,
            )
        n = resp.heartbeat_timeout_leases + resp.dead_engine_leases + resp.stale_generation_leases
        self.stats.invalidated += n
        metrics.INVALIDATED.inc(n)
        if n or resp.dead_engine_ids:
            log.info(
                "term %d: engines %s silent, marked dead; invalidated %d lease(s) (%d heartbeat, "
                "%d dead engine, %d stale generation)",
                term, list(resp.dead_engine_ids) or "none", n, resp.heartbeat_timeout_leases,
                resp.dead_engine_leases, resp.stale_generation_leases,
            )
        return n, list(resp.dead_engine_ids)

    async def enforce_retention(self, term: int, request_id: str = "") -> list[str]:
        """Create audit partitions ahead and drop those past retention under `term`."""
        async with self._work:
            resp = await self.registry.enforce_event_retention(
                rpb.EnforceEventRetentionRequest(
                    fence=self.fence(term),
                    retention_days=self.settings.retention_days,
                    days_ahead=self.settings.partition_days_ahead,
                    request_id=request_id,
                ),
                timeout=max(self.settings.registry_timeout_seconds, 30.0),
            )
        self.stats.dropped_partitions += len(resp.dropped_partitions)
        if resp.dropped_partitions or resp.busy_partitions:
            log.info(
                "term %d: dropped audit partitions %s (busy, retried later: %s)",
                term, list(resp.dropped_partitions), list(resp.busy_partitions) or "none",
            )
        return list(resp.dropped_partitions)

    async def release_unlikely(self, term: int) -> dict[str, int]:
        """Run the retention policy once under `term`: leases released per reason."""
        if self.retainer is None:
            return {}
        db_now = self.clock.db_now(self._loop.time())
        if db_now is None:
            return {}
        # Not under `_work`: the pass reads for seconds at scale, and expiries must not wait for
        # it; its releases are fenced by the term and change only RETAINED leases.
        released = await self.retainer.run(self.fence(term), db_now, self.actor)
        if released:
            log.info("term %d: released %s", term, ", ".join(f"{n} for {r}" for r, n in sorted(released.items())))
        return released

    async def reap_now(self, sweep: bool, retention: bool, request_id: str) -> ReapResult:
        """Do the leader's work now (ReapNow); NotLeader on a standby."""
        term = self.election.term
        if not self.election.holds(term):
            raise NotLeader()
        try:
            result = ReapResult(term, lags=await self.expire_due(term, request_id))
            if sweep:
                result.invalidated, result.dead_engine_ids = await self.sweep_engines(term, request_id)
            if retention:
                result.dropped_partitions = await self.enforce_retention(term, request_id)
        except BoomerangClientError as err:
            if err.reason == "FENCED":
                self.election.lost(term, err.error.message)
            raise
        self._wake.set()  # the tracker changed: let the loop re-plan
        return result
