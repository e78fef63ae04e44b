"""The reaper's SQL edge: its election row, read-only status figures, the advice history.

The reaper writes only `reaper_leader` (its own table). Lease state it changes through the
registry's RPCs; here it only reads leases and audit events, for GetStatus and AdviseTTL.
All times are decided on the database clock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from boomerang_reaper.advice import TurnRecord

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

# The latest election row as `boomerang status --database-url` shows it (any election).
STATUS_LEADER_SQL = """
SELECT holder, term, expires_at > now() AS unexpired, stats
FROM reaper_leader ORDER BY expires_at DESC LIMIT 1
"""

RELEASE_SQL = """
UPDATE reaper_leader SET expires_at = now(), renewed_at = now(), stats = CAST(:stats AS jsonb)
WHERE election = :election AND holder = :holder AND term = :term AND expires_at > now()
"""

LEASE_FIGURES_SQL = """
SELECT count(*) AS live, count(*) FILTER (WHERE expires_at <= now()) AS backlog,
       min(expires_at) AS next_deadline, now() AS db_now
FROM leases WHERE state IN ('RETAINED', 'CLAIMED')
"""

HISTORY_WINDOW_SQL = """
SELECT now() AS db_now, now() - make_interval(secs => CAST(:hours AS float8) * 3600) AS since
"""

# Every turn registered in the window, with the first claim of its lease (one pass over
# the window's partitions, joined by hash, not one index probe per lease and partition).
HISTORY_SQL = """
WITH reg AS (
    SELECT lease_id FROM lease_events
    WHERE reason = 'REGISTERED' AND from_state IS NULL AND created_at >= :since
), claims AS (
    SELECT lease_id, min(created_at) AS claimed_at FROM lease_events
    WHERE to_state = 'CLAIMED' AND created_at >= :since
    GROUP BY lease_id
)
SELECT l.tenant, l.model, l.conversation_id, l.lease_id::text AS lease_id, l.num_blocks, l.state,
       EXTRACT(EPOCH FROM l.finished_at)::float8 AS finished_at,
       EXTRACT(EPOCH FROM c.claimed_at)::float8 AS claimed_at,
       COALESCE(e.bytes_per_block, 0) AS bytes_per_block,
       COALESCE(e.kv_blocks_ttl_seconds, 0) AS engine_ttl_seconds
FROM reg JOIN leases l ON l.lease_id = reg.lease_id
LEFT JOIN claims c ON c.lease_id = l.lease_id
LEFT JOIN engines e ON e.engine_id = l.engine_id
WHERE (:tenant = '' OR l.tenant = :tenant)
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


@dataclass(frozen=True)
class LeaseFigures:
    """Live leases, those past their deadline, the next deadline, the database clock."""

    live: int
    backlog: int
    next_deadline: datetime | None
    db_now: datetime


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

    async def lease_figures(self) -> LeaseFigures:
        """Counts over live leases, from the live-lease deadline index."""
        async with self.engine.connect() as conn:
            row = (await conn.execute(text(LEASE_FIGURES_SQL))).one()
        return LeaseFigures(int(row.live), int(row.backlog), row.next_deadline, row.db_now)

    async def history(self, tenant: str, hours: float) -> tuple[list[TurnRecord], datetime, datetime]:
        """Turns registered in the last `hours` (optionally one tenant's); and the window."""
        async with self.engine.connect() as conn:
            window = (await conn.execute(text(HISTORY_WINDOW_SQL), {"hours": hours})).one()
            rows = await conn.execute(text(HISTORY_SQL), {"since": window.since, "tenant": tenant})
            records = [
                TurnRecord(
                    tenant=r.tenant,
                    model=r.model,
                    conversation_id=r.conversation_id,
                    lease_id=r.lease_id,
                    finished_at=r.finished_at,
                    num_blocks=r.num_blocks,
                    bytes_per_block=int(r.bytes_per_block),
                    engine_ttl_seconds=int(r.engine_ttl_seconds),
                    claimed_at=r.claimed_at,
                    state=r.state,
                )
                for r in rows
            ]
        return records, window.since, window.db_now


def _leader_row(row: Any) -> LeaderRow | None:
    if row is None:
        return None
    return LeaderRow(row.holder, row.term, row.expires_at, row.db_now, dict(row.stats or {}))


async def status_leader(conn: AsyncConnection) -> Any:
    """The latest election row (holder, term, unexpired, stats) as `boomerang status --database-url`
    shows it, or None before any election."""
    return (await conn.execute(text(STATUS_LEADER_SQL))).first()
