"""Lease-deadline hints for WatchLeaseDeadlines: one LISTEN connection, many watchers.

Migration 0003's trigger NOTIFYs `boomerang_lease_deadlines` with each new lease's deadline
at commit. The hub holds one dedicated asyncpg connection per registry process (opened by
the first watcher) and offers every deadline to every subscription. A subscription keeps
only the earliest deadline not yet sent, so a slow watcher never makes a queue grow and
still learns the deadline that matters (it wakes at the earliest one and then asks the
database for the next). A lost connection fails every subscription: its stream ends and
the watcher starts over from a fresh snapshot, so no deadline is silently missed.
"""

from __future__ import annotations

import asyncio
import logging
import math

import asyncpg
from boomerang.errors import BoomerangError, Code

log = logging.getLogger(__name__)
CHANNEL = "boomerang_lease_deadlines"
KEEPALIVE_SECONDS = 15.0


class Subscription:
    """One watcher's pending hint: the earliest deadline (epoch seconds) not yet sent."""

    def __init__(self) -> None:
        self.earliest: float | None = None
        self.error: BoomerangError | None = None
        self._ready = asyncio.Event()

    def offer(self, deadline: float) -> None:
        """Remember `deadline` if it is earlier than the pending one."""
        if self.earliest is None or deadline < self.earliest:
            self.earliest = deadline
        self._ready.set()

    def fail(self, error: BoomerangError) -> None:
        """End the subscription; the next `next()` raises `error`."""
        self.error = error
        self._ready.set()

    async def next(self) -> float:
        """Wait for a hint and take it."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            if self.error is not None:
                raise self.error
            if self.earliest is not None:
                deadline, self.earliest = self.earliest, None
                return deadline


class DeadlineHub:
    """Fans the database's deadline notifications out to subscriptions."""

    def __init__(self, dsn: str):
        self.dsn = dsn
        self.subscriptions: set[Subscription] = set()
        self._conn: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()
        self._keepalive: asyncio.Task[None] | None = None
        self._closed = False

    async def subscribe(self) -> Subscription:
        """A new subscription, listening before it returns (take the snapshot after this)."""
        if self._closed:
            raise BoomerangError(Code.UNAVAILABLE, "REGISTRY_DRAINING", "the registry is shutting down")
        async with self._lock:
            if self._conn is None or self._conn.is_closed():
                self._conn = await self._listen()
        sub = Subscription()
        self.subscriptions.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Forget a subscription (its stream ended)."""
        self.subscriptions.discard(sub)

    async def close(self) -> None:
        """End every subscription and the LISTEN connection (on drain)."""
        self._closed = True
        self._fail_all(BoomerangError(Code.UNAVAILABLE, "REGISTRY_DRAINING", "the registry is shutting down"))
        if self._keepalive is not None:
            self._keepalive.cancel()
        async with self._lock:
            if self._conn is not None and not self._conn.is_closed():
                await self._conn.close(timeout=2)
            self._conn = None

    async def _listen(self) -> asyncpg.Connection:
        try:
            conn = await asyncpg.connect(
                self.dsn, timeout=5, server_settings={"application_name": "boomerang-registry-watch"}
            )
            await conn.add_listener(CHANNEL, self._on_notify)
        except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
            raise BoomerangError(
                Code.UNAVAILABLE, "DATABASE_UNAVAILABLE", f"cannot listen for lease deadlines: {exc}"
            ) from exc
        conn.add_termination_listener(self._on_lost)
        if self._keepalive is None or self._keepalive.done():
            self._keepalive = asyncio.create_task(self._ping(), name="deadline-watch-keepalive")
        log.info("listening for lease deadlines on %s", CHANNEL)
        return conn

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            deadline = float(payload)
        except ValueError:
            log.warning("ignoring malformed deadline notification %r", payload)
            return
        if not math.isfinite(deadline):
            return
        for sub in self.subscriptions:
            sub.offer(deadline)

    def _on_lost(self, conn: object) -> None:
        if conn is self._conn:
            self._conn = None
        if not self._closed:
            log.warning("lost the lease-deadline LISTEN connection; watchers will resubscribe")
            self._fail_all(
                BoomerangError(Code.UNAVAILABLE, "DEADLINE_WATCH_LOST", "lost the database notifications")
            )

    def _fail_all(self, error: BoomerangError) -> None:
        for sub in list(self.subscriptions):
            sub.fail(error)
        self.subscriptions.clear()

    async def _ping(self) -> None:
        # A silently dead TCP connection would lose notifications without a termination
        # callback; a periodic round trip turns that into a failure watchers see.
        while not self._closed:
            await asyncio.sleep(KEEPALIVE_SECONDS)
            conn = self._conn
            if conn is None or conn.is_closed():
                continue
            try:
                await conn.execute("SELECT 1", timeout=5)
            except Exception:  # noqa: BLE001 - any failure means the channel is unusable
                conn.terminate()
                self._on_lost(conn)
