"""The registry's watch streams, each fed by one LISTEN connection per registry process.

Both hubs hold one dedicated asyncpg connection (opened by the first watcher) and offer what
it is notified to every subscription. Each stream listens before it reads its snapshot, so
nothing committed in between goes unseen. A lost connection fails every subscription: its
stream ends and the watcher starts over from a fresh snapshot, so nothing is silently missed.
A periodic round trip turns a silently dead TCP connection into such a loss.

WatchLeaseDeadlines (the TTL reaper's): migration 0003's trigger NOTIFYs
`boomerang_lease_deadlines` with each new lease's deadline at commit. A subscription keeps
only the earliest deadline not yet sent, so a slow watcher never makes a queue grow and
still learns the deadline that matters (it wakes at the earliest one and then asks the
database for the next).

WatchLeaseKeys (prefill hooks' and gateways'): the summary of live leases that lets a turn
with nothing to pull skip its plan. The keys are `boomerang.leasekeys`' (a conversation's, a
previous prompt's). A stream sends a snapshot of every live lease's keys in parts, then the
keys of each lease registered after it (migration 0013's NOTIFY, so a lease registered
through any replica reaches every watcher at its commit), then a fresh snapshot every
`lease_keys_refresh_seconds` (which drops the keys of leases that ended since; nothing else
removes a key, so between snapshots the summary only errs towards "maybe"). A snapshot is
read once and shared by the streams that ask within half the refresh period, with the keys
notified since it was read (kept for one refresh period), so a shared snapshot is as current
as a fresh one. A watcher that falls `MAX_PENDING_KEYS` behind has its stream ended: it
rules nothing out until its next snapshot.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import asyncpg
import grpc
from boomerang import leasekeys
from boomerang.errors import BoomerangError, Code, Violations
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang_server.rpc.server import error_for_exception, to_status
from boomerang_server.validation import check_id
from sqlalchemy.ext.asyncio import AsyncEngine

from boomerang_registry import wire
from boomerang_registry.expiry import ExpiryRepository

log = logging.getLogger(__name__)
KEYS_PER_PART = 65_536  # 512 KiB of keys per snapshot message
MAX_PENDING_KEYS = 1_000_000
KEEPALIVE_SECONDS = 15.0

# Every live lease, claimed ones included: a claim given back makes it pullable again.
LIVE_KEYS_SQL = """
SELECT tenant, conversation_id, prompt_key FROM leases
WHERE state IN ('RETAINED', 'CLAIMED') AND expires_at > now()
"""


def _draining() -> BoomerangError:
    return BoomerangError(Code.UNAVAILABLE, "REGISTRY_DRAINING", "the registry is shutting down")


class Waiter:
    """What a subscription shares: an error that ends it, and the event that wakes its stream."""

    def __init__(self) -> None:
        self.error: BoomerangError | None = None
        self._ready = asyncio.Event()

    def fail(self, error: BoomerangError) -> None:
        """End the subscription; its stream's next wait raises `error`."""
        self.error = error
        self._ready.set()


S = TypeVar("S", bound=Waiter)


class ListenHub(Generic[S]):
    """A LISTEN connection on `channel` and the subscriptions it feeds (`_on_notify`)."""

    channel = ""
    application_name = ""
    what = ""  # what the channel carries, for the error when it cannot be listened to
    lost_reason = ""  # the reason every subscription fails with when the connection is lost

    def __init__(self, dsn: str):
        self.dsn = dsn
        self.subscriptions: set[S] = set()
        self._conn: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()
        self._keepalive: asyncio.Task[None] | None = None
        self._closed = False

    async def _add(self, sub: S) -> S:
        """Listen (before the caller takes its snapshot), then feed `sub`."""
        if self._closed:
            raise _draining()
        async with self._lock:
            if self._conn is None or self._conn.is_closed():
                self._conn = await self._listen()
        self.subscriptions.add(sub)
        return sub

    def unsubscribe(self, sub: S) -> None:
        """Forget a subscription (its stream ended)."""
        self.subscriptions.discard(sub)

    async def close(self) -> None:
        """End every subscription and the LISTEN connection (on drain)."""
        self._closed = True
        self._fail_all(_draining())
        if self._keepalive is not None:
            self._keepalive.cancel()
        async with self._lock:
            if self._conn is not None and not self._conn.is_closed():
                await self._conn.close(timeout=2)
            self._conn = None

    async def _listen(self) -> asyncpg.Connection:
        try:
            conn = await asyncpg.connect(
                self.dsn, timeout=5, server_settings={"application_name": self.application_name}
            )
            await conn.add_listener(self.channel, self._on_notify)
        except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
            raise BoomerangError(
                Code.UNAVAILABLE, "DATABASE_UNAVAILABLE", f"cannot listen for {self.what}: {exc}"
            ) from exc
        conn.add_termination_listener(self._on_lost)
        if self._keepalive is None or self._keepalive.done():
            self._keepalive = asyncio.create_task(self._ping(), name=f"{self.channel}-keepalive")
        log.info("listening for %s on %s", self.what, self.channel)
        return conn

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        raise NotImplementedError

    def _on_lost(self, conn: object) -> None:
        if conn is self._conn:
            self._conn = None
        if not self._closed:
            log.warning("lost the LISTEN connection on %s; watchers will resubscribe", self.channel)
            self._fail_all(BoomerangError(Code.UNAVAILABLE, self.lost_reason, "lost the database notifications"))

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


class Subscription(Waiter):
    """One deadline watcher's pending hint: the earliest deadline (epoch seconds) not yet sent."""

    def __init__(self) -> None:
        super().__init__()
        self.earliest: float | None = None

    def offer(self, deadline: float) -> None:
        """Remember `deadline` if it is earlier than the pending one."""
        if self.earliest is None or deadline < self.earliest:
            self.earliest = deadline
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


class DeadlineHub(ListenHub[Subscription]):
    """Fans the database's deadline notifications out to subscriptions."""

    channel = "boomerang_lease_deadlines"
    application_name = "boomerang-registry-watch"
    what = "lease deadlines"
    lost_reason = "DEADLINE_WATCH_LOST"

    async def subscribe(self) -> Subscription:
        """A new subscription, listening before it returns (take the snapshot after this)."""
        return await self._add(Subscription())

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


class KeysSubscription(Waiter):
    """One lease-keys stream's keys not yet sent."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[int] = []

    def offer(self, keys: list[int]) -> None:
        if len(self.pending) + len(keys) > MAX_PENDING_KEYS:
            self.fail(BoomerangError(Code.RESOURCE_EXHAUSTED, "WATCHER_TOO_SLOW", "the watcher fell behind; resubscribe"))
            return
        self.pending.extend(keys)
        self._ready.set()

    async def next(self, timeout: float) -> list[int]:
        """The keys added since the last call, waiting at most `timeout` seconds for some."""
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            return []
        self._ready.clear()
        if self.error is not None:
            raise self.error
        keys, self.pending = self.pending, []
        return keys


class LeaseKeysHub(ListenHub[KeysSubscription]):
    """New leases' keys for the lease-keys streams, and the snapshot they share."""

    channel = "boomerang_lease_keys"
    application_name = "boomerang-registry-keys"
    what = "new leases"
    lost_reason = "LEASE_KEYS_LOST"

    def __init__(self, dsn: str, engine: AsyncEngine, refresh_seconds: float):
        super().__init__(dsn)
        self.engine = engine
        self.refresh_seconds = refresh_seconds
        self._snapshot_lock = asyncio.Lock()
        self._snapshot: tuple[float, list[int], int] | None = None  # (read from, keys, live leases)
        self._recent: deque[tuple[float, list[int]]] = deque()  # (notified, keys), one refresh period
        self._generation = 0  # bumped when notifications were lost

    async def subscribe(self) -> KeysSubscription:
        """A new subscription, listening before it returns (take the snapshot after this)."""
        return await self._add(KeysSubscription())

    async def snapshot(self) -> tuple[list[int], int]:
        """Every live lease's keys and the lease count, read at most every half refresh period."""
        async with self._snapshot_lock:
            cached = self._snapshot
            if cached is None or time.monotonic() - cached[0] >= self.refresh_seconds / 2:
                started = time.monotonic()  # a lease committed after the read notifies after this
                generation = self._generation
                async with self.engine.connect() as conn:
                    # The driver's own records: a row object per lease would cost more than its keys.
                    raw = (await conn.get_raw_connection()).driver_connection
                    assert raw is not None  # an open connection's asyncpg connection
                    rows = await raw.fetch(LIVE_KEYS_SQL)
                keys, live = leasekeys.keys_of_leases(rows), len(rows)
                cached = (started, keys, live)
                if generation == self._generation:
                    self._snapshot = cached
            since = [k for at, added in self._recent if at >= cached[0] for k in added]
            return cached[1] + since, cached[2]

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:  # one new lease's keys from its payload, `tenant␟conversation␟prompt_key`
            tenant, conversation_id, key = payload.split("\x1f")
            keys = leasekeys.lease_keys(tenant, conversation_id, int(key) if key else None)
        except ValueError:
            log.warning("ignoring malformed lease-keys notification %r", payload)
            return
        now = time.monotonic()
        self._recent.append((now, keys))
        while self._recent and self._recent[0][0] < now - self.refresh_seconds:
            self._recent.popleft()
        for sub in list(self.subscriptions):
            sub.offer(keys)

    def _on_lost(self, conn: object) -> None:
        # Notifications were missed: a shared snapshot can no longer be brought up to date.
        self._snapshot = None
        self._recent.clear()
        self._generation += 1
        super()._on_lost(conn)


def snapshot_messages(keys: list[int], live: int) -> list[rpb.WatchLeaseKeysResponse]:
    """A snapshot as stream messages: parts of at most KEYS_PER_PART keys, the last `complete`."""
    parts = [keys[i : i + KEYS_PER_PART] for i in range(0, len(keys), KEYS_PER_PART)] or [[]]
    return [
        rpb.WatchLeaseKeysResponse(snapshot=True, snapshot_complete=n == len(parts) - 1, keys=leasekeys.pack(part),
                                   live_leases=live if n == len(parts) - 1 else 0)
        for n, part in enumerate(parts)
    ]


class WatchServicer:
    """WatchLeaseKeys and WatchLeaseDeadlines, a mixin of BlockRegistryServicer.

    Async generators, not coroutines writing to `context`: the OpenTelemetry server
    interceptor iterates a streaming handler's result, so with tracing on a coroutine handler
    failed every watch (and the reaper fell back to polling)."""

    lease_keys_hub: LeaseKeysHub
    deadline_hub: DeadlineHub
    expiry: ExpiryRepository

    async def authorize(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        raise NotImplementedError  # BlockRegistryServicer's

    async def WatchLeaseKeys(
        self, request: rpb.WatchLeaseKeysRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rpb.WatchLeaseKeysResponse]:
        v = Violations()
        check_id(v, "watcher", request.watcher, required=False)
        hub = self.lease_keys_hub
        sub = None
        try:
            await self.authorize("WatchLeaseKeys", request, context)
            v.raise_if_any()
            sub = await hub.subscribe()
            log.info("lease-keys watch opened by %r", request.watcher or context.peer())
            while True:
                keys, live = await hub.snapshot()
                for message in snapshot_messages(keys, live):
                    yield message
                refresh_at = time.monotonic() + hub.refresh_seconds
                while (left := refresh_at - time.monotonic()) > 0:
                    added = await sub.next(left)
                    if added:
                        yield rpb.WatchLeaseKeysResponse(keys=leasekeys.pack(added))
        except Exception as exc:  # noqa: BLE001 - the stream's translation boundary (like @rpc)
            await context.abort_with_status(to_status(error_for_exception(exc)))
        finally:
            if sub is not None:
                hub.unsubscribe(sub)

    async def WatchLeaseDeadlines(
        self, request: rpb.WatchLeaseDeadlinesRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rpb.WatchLeaseDeadlinesResponse]:
        v = Violations()
        check_id(v, "watcher", request.watcher, required=False)
        sub = None
        try:
            await self.authorize("WatchLeaseDeadlines", request, context)
            v.raise_if_any()
            sub = await self.deadline_hub.subscribe()
            log.info("deadline watch opened by %r", request.watcher or context.peer())
            now = await self.expiry.live_figures()
            yield rpb.WatchLeaseDeadlinesResponse(
                snapshot=True,
                earliest_expire_time=wire.ts(now.next_deadline),
                live_leases=now.live,
                database_time=wire.ts(now.db_now),
            )
            while True:
                deadline = datetime.fromtimestamp(await sub.next(), tz=UTC)
                yield rpb.WatchLeaseDeadlinesResponse(earliest_expire_time=wire.ts(deadline))
        except Exception as exc:  # noqa: BLE001 - the stream's translation boundary (like @rpc)
            await context.abort_with_status(to_status(error_for_exception(exc)))
        finally:
            if sub is not None:
                self.deadline_hub.unsubscribe(sub)
