"""WatchLeaseKeys: the summary of live leases that lets a turn with nothing to pull skip its plan.

The keys are `boomerang.leasekeys`' (a conversation's, a previous prompt's). A watch stream
sends a snapshot of every live lease's keys in parts, then the keys of each lease registered
after it, then a fresh snapshot every `lease_keys_refresh_seconds` (which drops the keys of
leases that ended since; nothing else removes a key, so between snapshots the summary only
errs towards "maybe").

New leases come from migration 0013's NOTIFY, on one LISTEN connection per registry process
shared by every stream, so a lease registered through any replica reaches every watcher at
its commit. Each stream listens before it reads its snapshot, so no lease committed in between
goes unseen. A snapshot is read once and shared by the streams that ask within half the
refresh period, with the keys notified since it was read (kept for one refresh period), so a
shared snapshot is as current as a fresh one. A watcher that falls `MAX_PENDING_KEYS` behind, and every watcher when the
LISTEN connection is lost, has its stream ended: it rules nothing out until its next snapshot.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator

import asyncpg
import grpc
from boomerang import leasekeys
from boomerang.errors import BoomerangError, Code, Violations
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang_server.rpc.server import error_for_exception, to_status
from sqlalchemy.ext.asyncio import AsyncEngine

from boomerang_registry import requests

log = logging.getLogger(__name__)
CHANNEL = "boomerang_lease_keys"
KEYS_PER_PART = 65_536  # 512 KiB of keys per snapshot message
MAX_PENDING_KEYS = 1_000_000
KEEPALIVE_SECONDS = 15.0

# Every live lease, claimed ones included: a claim given back makes it pullable again.
LIVE_KEYS_SQL = """
SELECT tenant, conversation_id, prompt_key FROM leases
WHERE state IN ('RETAINED', 'CLAIMED') AND expires_at > now()
"""


def parse_notification(payload: str) -> list[int]:
    """The keys of one new lease from its NOTIFY payload (`tenant␟conversation␟prompt_key`)."""
    tenant, conversation_id, key = payload.split("\x1f")
    return leasekeys.lease_keys(tenant, conversation_id, int(key) if key else None)


class KeysSubscription:
    """One stream's keys not yet sent."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        self.error: BoomerangError | None = None
        self._ready = asyncio.Event()

    def offer(self, keys: list[int]) -> None:
        if len(self.pending) + len(keys) > MAX_PENDING_KEYS:
            self.fail(BoomerangError(Code.RESOURCE_EXHAUSTED, "WATCHER_TOO_SLOW", "the watcher fell behind; resubscribe"))
            return
        self.pending.extend(keys)
        self._ready.set()

    def fail(self, error: BoomerangError) -> None:
        self.error = error
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


class LeaseKeysHub:
    """The process's LISTEN connection for new leases' keys, its subscriptions and its snapshot."""

    def __init__(self, dsn: str, engine: AsyncEngine, refresh_seconds: float):
        self.dsn = dsn
        self.engine = engine
        self.refresh_seconds = refresh_seconds
        self.subscriptions: set[KeysSubscription] = set()
        self._conn: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()
        self._snapshot_lock = asyncio.Lock()
        self._snapshot: tuple[float, list[int], int] | None = None  # (read from, keys, live leases)
        self._recent: deque[tuple[float, list[int]]] = deque()  # (notified, keys), one refresh period
        self._generation = 0  # bumped when notifications were lost
        self._keepalive: asyncio.Task[None] | None = None
        self._closed = False

    async def subscribe(self) -> KeysSubscription:
        """A new subscription, listening before it returns (take the snapshot after this)."""
        if self._closed:
            raise BoomerangError(Code.UNAVAILABLE, "REGISTRY_DRAINING", "the registry is shutting down")
        async with self._lock:
            if self._conn is None or self._conn.is_closed():
                self._conn = await self._listen()
        sub = KeysSubscription()
        self.subscriptions.add(sub)
        return sub

    def unsubscribe(self, sub: KeysSubscription) -> None:
        self.subscriptions.discard(sub)

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
            conn = await asyncpg.connect(self.dsn, timeout=5, server_settings={"application_name": "boomerang-registry-keys"})
            await conn.add_listener(CHANNEL, self._on_notify)
        except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
            raise BoomerangError(Code.UNAVAILABLE, "DATABASE_UNAVAILABLE", f"cannot listen for new leases: {exc}") from exc
        conn.add_termination_listener(self._on_lost)
        if self._keepalive is None or self._keepalive.done():
            self._keepalive = asyncio.create_task(self._ping(), name="lease-keys-keepalive")
        return conn

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            keys = parse_notification(payload)
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
        if conn is self._conn:
            self._conn = None
        # Notifications were missed: a shared snapshot can no longer be brought up to date.
        self._snapshot = None
        self._recent.clear()
        self._generation += 1
        if not self._closed:
            log.warning("lost the lease-keys LISTEN connection; watchers will resubscribe")
            self._fail_all(BoomerangError(Code.UNAVAILABLE, "LEASE_KEYS_LOST", "lost the database notifications"))

    def _fail_all(self, error: BoomerangError) -> None:
        for sub in list(self.subscriptions):
            sub.fail(error)
        self.subscriptions.clear()

    async def _ping(self) -> None:
        # A silently dead TCP connection would lose notifications without a termination callback.
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


def snapshot_messages(keys: list[int], live: int) -> list[rpb.WatchLeaseKeysResponse]:
    """A snapshot as stream messages: parts of at most KEYS_PER_PART keys, the last `complete`."""
    parts = [keys[i : i + KEYS_PER_PART] for i in range(0, len(keys), KEYS_PER_PART)] or [[]]
    return [
        rpb.WatchLeaseKeysResponse(snapshot=True, snapshot_complete=n == len(parts) - 1, keys=leasekeys.pack(part),
                                   live_leases=live if n == len(parts) - 1 else 0)
        for n, part in enumerate(parts)
    ]


class LeaseKeysServicer:
    """WatchLeaseKeys, a mixin of BlockRegistryServicer (prefill hooks and gateways call it)."""

    lease_keys_hub: LeaseKeysHub

    async def WatchLeaseKeys(
        self, request: rpb.WatchLeaseKeysRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rpb.WatchLeaseKeysResponse]:
        v = Violations()
        requests.check_id(v, "watcher", request.watcher, required=False)
        hub = self.lease_keys_hub
        sub = None
        try:
            authorize = getattr(self, "authorize", None)
            if authorize is not None:
                await authorize("WatchLeaseKeys", request, context)
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
