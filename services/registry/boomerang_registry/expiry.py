"""The registry's SQL for the TTL reaper: expiry, engine liveness, audit retention, releases.

Only the registry writes lease state; the reaper asks for these through fenced RPCs. Each
fenced method first locks the election's `reaper_leader` row FOR SHARE in its own
transaction and refuses (FAILED_PRECONDITION `FENCED`) unless the caller's term is the
current one and unexpired on the database clock; the lock holds off a takeover until the
transaction ends, so a paused leader's late write either lands inside its own term or is
refused. Due and stale leases are locked SKIP LOCKED: the reaper never waits behind a claim
in flight (the skipped lease is still due and is picked up by the next call), and two
callers can never expire or invalidate the same lease twice, since each transition also
requires the lease to be live.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
import sqlalchemy.exc
from boomerang.errors import failed_precondition
from boomerang_server.leases import LIVE_SQL, LeaseState
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from boomerang_registry.statements import TRANSITION_SQL

Row = Mapping[Any, Any]  # a result row by column name (SQLAlchemy's RowMapping keys by str or Column)
DEFAULT_ELECTION = "ttl-reaper"
# Day-partitioned tables under the audit retention, with the function that makes their
# partitions ahead: the lease audit trail, and the router's plan records.
RETAINED_TABLES = (
    ("lease_events", "boomerang_ensure_event_partitions"),
    ("turn_plans", "boomerang_ensure_turn_plan_partitions"),
)

FENCE_SQL = """
SELECT term, holder, expires_at > now() AS unexpired
FROM reaper_leader WHERE election = :election FOR SHARE
"""

EXPIRE_SQL = f"""
WITH due AS (
    SELECT lease_id, tenant, conversation_id, state FROM leases
    WHERE state IN {LIVE_SQL} AND expires_at <= now()
    ORDER BY expires_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), moved AS (
    -- An unclaimed lease's blocks are freed on D now (a claimed one is never released under
    -- its puller: D frees it at its own TTL).
    UPDATE leases l SET state = 'EXPIRED', version = l.version + 1, updated_at = now(),
           release_pending = (due.state = 'RETAINED')
    FROM due WHERE l.tenant = due.tenant AND l.conversation_id = due.conversation_id
      AND l.lease_id = due.lease_id
    RETURNING l.lease_id, l.tenant, l.conversation_id, l.claim_id, l.expires_at,
              due.state AS from_state
), ev AS (
    INSERT INTO lease_events (lease_id, tenant, conversation_id, from_state, to_state, reason,
                              actor, request_id, claim_id, details)
    SELECT lease_id, tenant, conversation_id, from_state, 'EXPIRED', 'TTL_EXPIRED', :actor,
           :request_id, COALESCE(claim_id, ''),
           jsonb_build_object('lag_seconds', EXTRACT(EPOCH FROM now() - expires_at)::float8,
                              'expire_time', expires_at, 'term', CAST(:term AS bigint))
    FROM moved
)
SELECT lease_id::text AS lease_id, tenant, conversation_id, from_state, expires_at,
       EXTRACT(EPOCH FROM now() - expires_at)::float8 AS lag_seconds
FROM moved ORDER BY expires_at
"""

# Runs after EXPIRE_SQL in the same transaction, so it sees what that statement ended.
NEXT_DEADLINE_SQL = f"""
SELECT min(expires_at) AS next_deadline, now() AS db_now FROM leases WHERE state IN {LIVE_SQL}
"""

# Live leases, those past their deadline and the next deadline, from the live-lease deadline index.
LIVE_FIGURES_SQL = f"""
SELECT min(expires_at) AS next_deadline, count(*) AS live,
       count(*) FILTER (WHERE expires_at <= now()) AS overdue, now() AS db_now
FROM leases WHERE state IN {LIVE_SQL}
"""

MARK_SILENT_SQL = """
UPDATE engines SET status = 'DEAD'
WHERE status = 'ACTIVE' AND heartbeat_at < now() - make_interval(secs => CAST(:timeout AS float8))
RETURNING engine_id
"""

# Candidates come from the per-engine live-lease index: every live lease of a dead engine,
# and the range below the current generation of an active one (never a scan of every lease).
SWEEP_SQL = f"""
WITH cand_ids AS (
    SELECT l.lease_id,
           CASE WHEN e.engine_id = ANY(CAST(:silent AS text[])) THEN 'HEARTBEAT_TIMEOUT'
                ELSE 'ENGINE_DEAD' END AS reason
    FROM engines e JOIN leases l ON l.engine_id = e.engine_id AND l.state IN {LIVE_SQL}
    WHERE e.status = 'DEAD'
    UNION ALL
    SELECT l.lease_id, 'GENERATION_ADVANCED'
    FROM engines e JOIN leases l ON l.engine_id = e.engine_id
        AND l.engine_generation < e.generation AND l.state IN {LIVE_SQL}
    WHERE e.status = 'ACTIVE'
), cand AS (
    SELECT l.lease_id, l.state, c.reason FROM leases l JOIN cand_ids c ON c.lease_id = l.lease_id
    WHERE l.state IN {LIVE_SQL}
    FOR UPDATE OF l SKIP LOCKED
), moved AS (
    UPDATE leases l SET state = 'INVALIDATED', version = l.version + 1, updated_at = now()
    FROM cand WHERE l.lease_id = cand.lease_id
    RETURNING l.lease_id, l.tenant, l.conversation_id, l.claim_id, l.engine_id,
              l.engine_generation, cand.state AS from_state, cand.reason
), ev AS (
    INSERT INTO lease_events (lease_id, tenant, conversation_id, from_state, to_state, reason,
                              actor, request_id, claim_id, details)
    SELECT lease_id, tenant, conversation_id, from_state, 'INVALIDATED', reason, :actor,
           :request_id, COALESCE(claim_id, ''),
           jsonb_build_object('engine_id', engine_id, 'engine_generation', engine_generation)
    FROM moved
)
SELECT reason, count(*) AS leases FROM moved GROUP BY reason
"""

# Day partitions whose whole range [day, day + 1) lies before the cutoff.
EXPIRED_PARTITIONS_SQL = """
SELECT c.relname AS name
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = to_regclass(:parent) AND c.relname ~ ('^' || :parent || '_p[0-9]{8}$')
  AND ((to_date(right(c.relname, 8), 'YYYYMMDD') + 1)::timestamp
       AT TIME ZONE 'UTC') <= now() - make_interval(days => :days)
ORDER BY c.relname
"""

CUTOFF_SQL = "SELECT now() - make_interval(days => :days)"

# Creating and dropping partitions lock `lease_events` briefly; never queue the hot path
# (every registration appends events) behind a long wait for such a lock.
LOCK_TIMEOUT = "500ms"


# Releases: ending leases nobody will pull, so their decode engine frees the blocks early.
# A lease the retention policy or memory pressure gives up on moves `RETAINED → RELEASED` in
# one statement (the lease locked, re-checked `RETAINED` after the lock, moved, its event
# appended) and is marked `release_pending`. A claim racing it locks the same row: whichever
# commits first wins, and the other finds the lease no longer `RETAINED` (a claimed lease is
# never released under its puller; a released one is never claimed). The engine's next
# heartbeat takes the release (statements.HEARTBEAT_SQL) and its hook frees the blocks
# through vLLM's own expiry path. Supersession, expiry, consumption and a claim that ends its
# lease mark `release_pending` in their own statements.
# Why the registry released a lease early (the event's reason).
RELEASE_REASONS = frozenset({"RETENTION_POLICY", "MEMORY_PRESSURE", "OPERATOR"})
RELEASE_LEASES_SQL = TRANSITION_SQL.format(
    where="lease_id = ANY(CAST(:ids AS uuid[])) AND state = 'RETAINED'", extra_set=", release_pending = true"
)


@dataclass(frozen=True)
class Fence:
    """A reaper leadership term the caller claims to hold."""

    election: str
    term: int


@dataclass(frozen=True)
class ExpiryOutcome:
    """What one ExpireLeases call did."""

    expired: list[Row]
    next_deadline: datetime | None
    db_now: datetime
    more_due: bool


@dataclass(frozen=True)
class SweepOutcome:
    """What one SweepEngines call did."""

    dead_engine_ids: list[str]
    leases_by_reason: dict[str, int]
    db_now: datetime


PURGE_BATCH = 10_000
PURGE_MAX_BATCHES = 50
PURGE_ENDED_SQL = """
WITH gone AS (
    DELETE FROM leases WHERE lease_id IN (
        SELECT lease_id FROM leases
        WHERE created_at < :cutoff AND state NOT IN ('RETAINED', 'CLAIMED')
        ORDER BY created_at LIMIT :limit
    )
    RETURNING 1
)
SELECT count(*) FROM gone
"""


@dataclass(frozen=True)
class LiveFigures:
    """What CountLiveLeases (and the deadline watch's snapshot) answer."""

    live: int
    overdue: int
    next_deadline: datetime | None
    db_now: datetime


@dataclass(frozen=True)
class RetentionOutcome:
    """What one EnforceEventRetention call did."""

    dropped: list[str]
    busy: list[str]
    created: int
    cutoff: datetime
    purged_leases: int = 0


def _lock_not_granted(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, asyncpg.exceptions.LockNotAvailableError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class ExpiryRepository:
    """Fenced expiry, engine sweeps and retention; one transaction per method."""

    def __init__(self, engine: AsyncEngine):
        self.engine = engine

    async def check_fence(self, conn: AsyncConnection, fence: Fence) -> None:
        """Lock the election row and refuse unless `fence` is its current, unexpired term."""
        row = (await conn.execute(text(FENCE_SQL), {"election": fence.election})).first()
        if row is not None and row.term == fence.term and row.unexpired:
            return
        if row is None:
            detail = f"no reaper has been elected in {fence.election!r}"
        elif row.term != fence.term:
            detail = f"term {fence.term} is not the current term {row.term} (held by {row.holder!r})"
        else:
            detail = f"term {fence.term} lapsed without renewal"
        err = failed_precondition("FENCED", f"reaper fence refused: {detail}")
        if row is not None:
            err.metadata.update(term=str(row.term), holder=row.holder)
        raise err

    async def live_figures(self) -> LiveFigures:
        """The live leases, those overdue, the earliest live deadline, the database clock."""
        async with self.engine.connect() as conn:
            row = (await conn.execute(text(LIVE_FIGURES_SQL))).one()
            return LiveFigures(int(row.live), int(row.overdue), row.next_deadline, row.db_now)

    async def expire_due(self, fence: Fence, limit: int, actor: str, request_id: str) -> ExpiryOutcome:
        """Expire up to `limit` due leases, earliest deadline first."""
        params = {"limit": limit, "actor": actor, "request_id": request_id, "term": fence.term}
        async with self.engine.begin() as conn:
            await self.check_fence(conn, fence)
            expired: list[Row] = [r._mapping for r in await conn.execute(text(EXPIRE_SQL), params)]
            nxt = (await conn.execute(text(NEXT_DEADLINE_SQL))).one()
        more = len(expired) >= limit and nxt.next_deadline is not None and nxt.next_deadline <= nxt.db_now
        return ExpiryOutcome(expired, nxt.next_deadline, nxt.db_now, more)

    async def sweep_engines(
        self, fence: Fence, heartbeat_timeout: float, actor: str, request_id: str
    ) -> SweepOutcome:
        """Mark silent engines dead; invalidate live leases of dead engines and old generations."""
        async with self.engine.begin() as conn:
            await self.check_fence(conn, fence)
            silent: list[str] = []
            if heartbeat_timeout > 0:
                rows = await conn.execute(text(MARK_SILENT_SQL), {"timeout": heartbeat_timeout})
                silent = sorted(r.engine_id for r in rows)
            counts = await conn.execute(
                text(SWEEP_SQL), {"silent": silent, "actor": actor, "request_id": request_id}
            )
            by_reason = {r.reason: int(r.leases) for r in counts}
            db_now = (await conn.execute(text("SELECT now()"))).scalar_one()
        return SweepOutcome(silent, by_reason, db_now)

    async def enforce_retention(self, fence: Fence, retention_days: int, days_ahead: int) -> RetentionOutcome:
        """Create partitions ahead; drop whole day partitions older than the retention."""
        created = 0
        try:
            async with self.engine.begin() as conn:
                await self.check_fence(conn, fence)
                await conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
                for parent, ensure in RETAINED_TABLES:
                    if (await conn.execute(text("SELECT to_regclass(:t)"), {"t": parent})).scalar_one() is None:
                        continue  # that service's migration is not applied here
                    made = await conn.execute(text(f"SELECT {ensure}(0, :ahead)"), {"ahead": days_ahead})
                    created += int(made.scalar_one())
        except sqlalchemy.exc.DBAPIError as exc:
            if not _lock_not_granted(exc):
                raise  # a busy default partition only delays creation to the next run
        async with self.engine.begin() as conn:
            await self.check_fence(conn, fence)
            due = [
                r.name
                for parent, _ in RETAINED_TABLES
                for r in await conn.execute(text(EXPIRED_PARTITIONS_SQL), {"parent": parent, "days": retention_days})
            ]
            cutoff = (await conn.execute(text(CUTOFF_SQL), {"days": retention_days})).scalar_one()
        dropped: list[str] = []
        busy: list[str] = []
        for name in due:  # one transaction each: a busy partition does not hold up the rest
            try:
                async with self.engine.begin() as conn:
                    await self.check_fence(conn, fence)
                    await conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
                    # `name` matched `<parent>_pYYYYMMDD` in the catalog query: safe to quote.
                    await conn.execute(text(f'DROP TABLE IF EXISTS "{name}"'))
                dropped.append(name)
            except sqlalchemy.exc.DBAPIError as exc:
                if not _lock_not_granted(exc):
                    raise
                busy.append(name)
        purged = await self._purge_ended_leases(fence, cutoff)
        return RetentionOutcome(dropped, busy, created, cutoff, purged)

    async def _purge_ended_leases(self, fence: Fence, cutoff: datetime) -> int:
        """Delete ended leases created before the cutoff, in bounded batches.

        Lease rows are state, not audit: once their events are past retention, an ended
        lease is deleted (live ones never are). Batches keep each transaction short.
        """
        purged = 0
        for _ in range(PURGE_MAX_BATCHES):
            async with self.engine.begin() as conn:
                await self.check_fence(conn, fence)
                done = (await conn.execute(text(PURGE_ENDED_SQL), {"cutoff": cutoff, "limit": PURGE_BATCH})).scalar_one()
            purged += int(done)
            if done < PURGE_BATCH:
                break
        return purged

    async def release(
        self, lease_ids: Sequence[str], reason: str, request_id: str, actor: str = "registry",
        fence: Fence | None = None,
    ) -> list[str]:
        """Move those of `lease_ids` still RETAINED to RELEASED; the ids moved.

        With `fence` (ReleaseLeases), the caller's term is checked first in the same
        transaction, so a deposed leader's decision never lands. Leases belong to every
        tenant, so this runs as the owner."""
        if reason not in RELEASE_REASONS:
            raise ValueError(f"release reason {reason!r} is not one of {sorted(RELEASE_REASONS)}")
        if not lease_ids:
            return []
        async with self.engine.begin() as conn:
            if fence is not None:
                await self.check_fence(conn, fence)
            rows = await conn.execute(
                text(RELEASE_LEASES_SQL),
                {"ids": list(lease_ids), "to_state": LeaseState.RELEASED.value, "reason": reason,
                 "actor": actor, "request_id": request_id, "event_claim_id": ""},
            )
            return [r.lease_id for r in rows]
