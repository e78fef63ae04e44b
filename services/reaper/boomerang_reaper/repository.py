"""The reaper's SQL edge: its election row in `reaper_leader`, its own table.

Lease state it reads and changes through the registry's RPCs only. All times are decided on
the database clock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

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

