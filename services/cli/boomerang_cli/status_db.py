"""`boomerang status --database-url`: the same report read straight from Postgres.

Reuse over the window is exact here: it counts the router's `turn_plans` rows.
"""

from __future__ import annotations

import time
from typing import Any

from boomerang.db.engine import make_engine
from boomerang.leases import ENDED_STATES, LIVE_STATES
from sqlalchemy import text

from boomerang_cli.status_common import retained_rows, saved_seconds
from boomerang_cli.status_reuse import OUTCOMES_SQL, outcomes_from_rows
from boomerang_cli.tables import iso

ENGINES_SQL = """
SELECT e.engine_id, e.role, e.model, e.status, e.generation, e.http_base_url, e.kv_blocks_ttl_seconds,
       e.bytes_per_block, e.in_flight_requests, e.queued_prompt_tokens,
       EXTRACT(EPOCH FROM now() - e.heartbeat_at) AS heartbeat_age,
       COALESCE((SELECT sum(l.num_blocks) FROM leases l
                 WHERE l.engine_id = e.engine_id AND l.state IN ('RETAINED', 'CLAIMED')), 0) AS retained_blocks
FROM engines e ORDER BY e.role, e.engine_id
"""
LIVE_SQL = "SELECT state, count(*) AS n FROM leases WHERE state IN ('RETAINED', 'CLAIMED') GROUP BY state"
ENDED_SQL = (
    "SELECT state, count(*) AS n FROM leases WHERE state NOT IN ('RETAINED', 'CLAIMED') "
    "AND updated_at >= now() - make_interval(secs => :window) GROUP BY state"
)
PLANS_SQL = """
SELECT decision, reason, count(*) AS turns, COALESCE(sum(prompt_tokens), 0) AS prompt_tokens,
       COALESCE(sum(reused_tokens), 0) AS reused_tokens
FROM turn_plans WHERE created_at >= now() - make_interval(secs => :window)
GROUP BY decision, reason ORDER BY decision, reason
"""
REAPER_SQL = """
SELECT holder, term, expires_at > now() AS unexpired, stats,
       (SELECT count(*) FROM leases WHERE state IN ('RETAINED', 'CLAIMED')) AS live,
       (SELECT count(*) FROM leases WHERE state IN ('RETAINED', 'CLAIMED') AND expires_at <= now()) AS backlog,
       (SELECT min(expires_at) FROM leases WHERE state IN ('RETAINED', 'CLAIMED')) AS next_deadline
FROM reaper_leader ORDER BY expires_at DESC LIMIT 1
"""


def window_from_plans(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Reuse over the window from `turn_plans` rows grouped by decision and reason."""
    turns = sum(int(r["turns"]) for r in rows)
    pulled = sum(int(r["turns"]) for r in rows if r["decision"] == "PULL")
    reused = sum(int(r["reused_tokens"]) for r in rows)
    prompt = sum(int(r["prompt_tokens"]) for r in rows)
    return {
        "turns": turns,
        "pulled_turns": pulled,
        "reuse_rate": pulled / turns if turns else None,
        "reused_tokens": reused,
        "prompt_tokens": prompt,
        "token_reuse_rate": reused / prompt if prompt else None,
        "by_decision": [
            {"decision": r["decision"], "reason": r["reason"], "turns": int(r["turns"])} for r in rows
        ],
        "exact": True,
        "source": "turn_plans",
    }


async def gather_db(url: str, window: float) -> dict[str, Any]:
    """The report from Postgres."""
    now = time.time()
    engine = make_engine(url, 1, "boomerang-status")
    try:
        async with engine.connect() as conn:
            engines = [dict(r._mapping) for r in await conn.execute(text(ENGINES_SQL))]
            live = {r.state: int(r.n) for r in await conn.execute(text(LIVE_SQL))}
            ended = {r.state: int(r.n) for r in await conn.execute(text(ENDED_SQL), {"window": window})}
            plans = [dict(r._mapping) for r in await conn.execute(text(PLANS_SQL), {"window": window})]
            outcomes = [dict(r._mapping) for r in await conn.execute(text(OUTCOMES_SQL), {"window": window})]
            leader = (await conn.execute(text(REAPER_SQL))).first()
    finally:
        await engine.dispose()
    rows = [
        {
            "engine_id": e["engine_id"],
            "role": e["role"],
            "model": e["model"],
            "status": e["status"],
            "generation": int(e["generation"]),
            "heartbeat_age_seconds": round(float(e["heartbeat_age"]), 3),
            "in_flight_requests": int(e["in_flight_requests"]),
            "queued_prompt_tokens": int(e["queued_prompt_tokens"]),
            "retained_blocks": int(e["retained_blocks"]),
            "retained_bytes": int(e["retained_blocks"]) * int(e["bytes_per_block"]) if e["bytes_per_block"] else None,
            "kv_ttl_seconds": int(e["kv_blocks_ttl_seconds"]),
            "http_base_url": e["http_base_url"],
        }
        for e in engines
    ]
    reuse = window_from_plans(plans)
    reuse["outcomes"] = outcomes_from_rows(outcomes)
    reuse.update(window_seconds=window, partial=False, ended_leases={s: ended.get(s, 0) for s in ENDED_STATES},
                 saved_prefill_seconds=round(saved_seconds(reuse["reused_tokens"]), 3))
    return {
        "source": "database",
        "generated_at": iso(now),
        "engines": rows,
        "live_leases": {"by_state": {s: live.get(s, 0) for s in LIVE_STATES}, "partial": False},
        "retained": retained_rows(rows),
        "reuse": reuse,
        "router": None,
        "reaper": _reaper(leader),
    }


def _reaper(row: Any) -> dict[str, Any] | None:
    if row is None:
        return None
    stats = row.stats or {}
    lag = stats.get("lag", {})
    return {
        "address": "database",
        "leader_replica_id": row.holder if row.unexpired else "",
        "term": int(row.term),
        "live_leases": int(row.live),
        "backlog_leases": int(row.backlog),
        "next_expire_time": iso(row.next_deadline),
        "expired_leases": int(stats.get("expired", 0)),
        "invalidated_leases": int(stats.get("invalidated", 0)),
        "expiry_lag": {"count": int(lag.get("count", 0)), "p50_seconds": float(lag.get("p50", 0.0)),
                       "p99_seconds": float(lag.get("p99", 0.0)), "max_seconds": float(lag.get("max", 0.0))},
    }
