"""What others read of the registry's tables (`engines`, `leases`, `lease_events`) straight
from Postgres.

The registry owns these tables; every statement naming them lives in this package (see
docs/design.md, "Who owns which table", and tests/unit/test_table_owners.py). Readers go
through the registry's RPCs; the exceptions run here, outside the registry's process:
`boomerang status --database-url` (`status_figures`: the window's exact figures, which no
registry RPC serves yet, also while the services are down) and the benchmark, which loads
and inspects leases. Changing a lease column means changing this package alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# -- `boomerang status --database-url` ---------------------------------------------------------

STATUS_ENGINES_SQL = """
SELECT e.engine_id, e.role, e.model, e.status, e.generation, e.http_base_url, e.kv_blocks_ttl_seconds,
       e.bytes_per_block, e.in_flight_requests, e.queued_prompt_tokens,
       EXTRACT(EPOCH FROM now() - e.heartbeat_at) AS heartbeat_age,
       COALESCE((SELECT sum(l.num_blocks) FROM leases l
                 WHERE l.engine_id = e.engine_id AND l.state IN ('RETAINED', 'CLAIMED')), 0) AS retained_blocks
FROM engines e ORDER BY e.role, e.engine_id
"""
STATUS_LIVE_SQL = "SELECT state, count(*) AS n FROM leases WHERE state IN ('RETAINED', 'CLAIMED') GROUP BY state"
STATUS_ENDED_SQL = (
    "SELECT state, count(*) AS n FROM leases WHERE state NOT IN ('RETAINED', 'CLAIMED') "
    "AND updated_at >= now() - make_interval(secs => :window) GROUP BY state"
)
# Live leases, those past their deadline (the reaper's backlog) and the next deadline, from
# the live-lease deadline index.
LEASE_FIGURES_SQL = """
SELECT count(*) AS live, count(*) FILTER (WHERE expires_at <= now()) AS backlog,
       min(expires_at) AS next_deadline, now() AS db_now
FROM leases WHERE state IN ('RETAINED', 'CLAIMED')
"""

# Decode memory: each lease's blocks × the part of its life inside the window (a live lease
# up to now, an ended one up to its last state change, when D was told to free it); and the
# window's ending events, RELEASED split by why the registry released it.
STATUS_BLOCK_SECONDS_SQL = """
SELECT engine_id, COALESCE(sum(num_blocks * GREATEST(0, EXTRACT(EPOCH FROM
           (CASE WHEN state IN ('RETAINED', 'CLAIMED') THEN now() ELSE updated_at END)
           - GREATEST(created_at, now() - make_interval(secs => :window))))), 0)::float8 AS block_seconds
FROM leases
WHERE state IN ('RETAINED', 'CLAIMED') OR updated_at >= now() - make_interval(secs => :window)
GROUP BY engine_id
"""
STATUS_RELEASES_SQL = """
SELECT CASE WHEN to_state = 'RELEASED' THEN reason ELSE to_state END AS reason, count(*) AS n
FROM lease_events
WHERE created_at >= now() - make_interval(secs => :window)
  AND to_state IN ('CONSUMED', 'SUPERSEDED', 'EXPIRED', 'INVALIDATED', 'RELEASED')
GROUP BY 1
"""


@dataclass(frozen=True)
class StatusFigures:
    """The registry's part of `boomerang status --database-url`."""

    engines: list[dict[str, Any]]  # STATUS_ENGINES_SQL's rows
    live: dict[str, int]  # live leases by state
    ended: dict[str, int]  # leases that ended in the window, by state
    live_leases: int
    backlog_leases: int  # live leases past their deadline (the reaper's backlog)
    next_deadline: Any  # the earliest live deadline (datetime), or None
    block_seconds: dict[str, float]  # per engine, over the window
    releases: dict[str, int]  # the window's ending events by reason (RELEASED split by why)


async def status_figures(conn: AsyncConnection, window: float) -> StatusFigures:
    """Engines, leases by state and decode memory over the last `window` seconds."""
    w = {"window": window}
    engines = [dict(r._mapping) for r in await conn.execute(text(STATUS_ENGINES_SQL))]
    live = {r.state: int(r.n) for r in await conn.execute(text(STATUS_LIVE_SQL))}
    ended = {r.state: int(r.n) for r in await conn.execute(text(STATUS_ENDED_SQL), w)}
    figures = (await conn.execute(text(LEASE_FIGURES_SQL))).one()
    held = {r.engine_id: float(r.block_seconds) for r in await conn.execute(text(STATUS_BLOCK_SECONDS_SQL), w)}
    releases = {r.reason: int(r.n) for r in await conn.execute(text(STATUS_RELEASES_SQL), w)}
    return StatusFigures(engines, live, ended, int(figures.live), int(figures.backlog), figures.next_deadline,
                         held, releases)


# -- the benchmark (asyncpg, `$n` parameters) --------------------------------------------------

# The columns a RegisterRetainedBlocks writes (statements.REGISTER_BATCH_SQL), in the order
# the benchmark's preload builds its COPY records; and the REGISTERED event it appends.
PRELOAD_LEASE_COLUMNS = (
    "lease_id", "tenant", "conversation_id", "model", "engine_id", "engine_generation",
    "remote_request_id", "block_ids", "num_blocks", "num_tokens", "block_size", "chain",
    "tail_hash", "remote_host", "remote_port", "tp_size", "dcp_size", "pp_size", "state",
    "version", "finished_at", "created_at", "expires_at", "updated_at", "prompt_tokens", "prompt_key",
    "prompt_tail",
)
PRELOAD_EVENT_COLUMNS = (
    "created_at", "lease_id", "tenant", "conversation_id", "from_state", "to_state", "reason",
    "actor", "request_id",
)

BENCH_SIZES_SQL = """
SELECT pg_database_size(current_database()) AS database_bytes,
       pg_total_relation_size('leases') AS leases_bytes,
       pg_indexes_size('leases') AS lease_index_bytes,
       (SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0)::bigint FROM pg_inherits
        WHERE inhparent = 'lease_events'::regclass) AS events_bytes,
       (SELECT count(*) FROM leases WHERE state IN ('RETAINED', 'CLAIMED')) AS live_leases
"""
# A benchmark-only shortcut (in service the prefill node's report settles each claim).
BENCH_REARM_SQL = (
    "UPDATE leases SET state = 'RETAINED', claim_id = NULL, version = version + 1, updated_at = now() "
    "WHERE state = 'CLAIMED' AND tenant LIKE $1"
)
BENCH_VACUUM_SQL = "VACUUM (ANALYZE) leases"
BENCH_LIVE_BY_TENANT_SQL = "SELECT count(*) FROM leases WHERE tenant LIKE $1 AND state IN ('RETAINED', 'CLAIMED')"
BENCH_EXPIRY_LAGS_SQL = (
    "SELECT (details->>'lag_seconds')::float8 FROM lease_events WHERE reason = 'TTL_EXPIRED' AND tenant LIKE $1"
)
BENCH_EXPIRED_EARLY_SQL = (
    "SELECT count(*) FROM lease_events WHERE reason = 'TTL_EXPIRED' AND tenant LIKE $1 "
    "AND (details->>'lag_seconds')::float8 < 0"
)


async def copy_registrations(
    conn: asyncpg.Connection, leases: Sequence[tuple[object, ...]], events: Sequence[tuple[object, ...]]
) -> None:
    """COPY live leases and their REGISTERED events in one transaction (the tables' triggers,
    the deadline NOTIFY included, run as for a registration)."""
    async with conn.transaction():
        await conn.copy_records_to_table("leases", records=leases, columns=PRELOAD_LEASE_COLUMNS)
        await conn.copy_records_to_table("lease_events", records=events, columns=PRELOAD_EVENT_COLUMNS)
