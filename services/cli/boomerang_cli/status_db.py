"""`boomerang status --database-url`: the same report read straight from Postgres.

Why a database path at all, when `boomerang audit` and the rest read the services: the
window's figures are exact here and have no RPC yet (reuse counted from every `turn_plans`
row, releases split by why the registry released a lease, block-seconds from every lease
that ended in the window; the APIs' report derives them from listed leases), and an operator
can still read the state while the services are down. It runs no SQL of its own: each
owner's function reads its tables (docs/design.md, "Who owns which table") and this module
only shapes the rows.
"""

from __future__ import annotations

import time
from typing import Any

from boomerang_reaper.repository import status_leader
from boomerang_registry.inspection import StatusFigures, status_figures
from boomerang_router.inspection import reuse_window
from boomerang_server.db.engine import make_engine
from boomerang_server.leases import ENDED_STATES, LIVE_STATES

from boomerang_cli.status_common import retained_rows, saved_seconds
from boomerang_cli.status_memory import memory_section
from boomerang_cli.status_reuse import outcomes_from_rows
from boomerang_cli.tables import iso


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
            registry = await status_figures(conn, window)
            plans, outcomes = await reuse_window(conn, window)
            leader = await status_leader(conn)
    finally:
        await engine.dispose()
    engines, ended = registry.engines, registry.ended
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
        "live_leases": {"by_state": {s: registry.live.get(s, 0) for s in LIVE_STATES}, "partial": False},
        "retained": retained_rows(rows),
        "reuse": reuse,
        "router": None,
        "reaper": _reaper(leader, registry),
        "memory": memory_section(retained_rows(rows), registry.block_seconds, registry.releases,
                                 sum(int(p["turns"]) for p in plans if p["reason"] == "LEASE_RELEASED"), window, exact=True),
    }


def _reaper(row: Any, figures: StatusFigures) -> dict[str, Any] | None:
    if row is None:
        return None
    stats = row.stats or {}
    lag = stats.get("lag", {})
    return {
        "address": "database",
        "leader_replica_id": row.holder if row.unexpired else "",
        "term": int(row.term),
        "live_leases": figures.live_leases,
        "backlog_leases": figures.backlog_leases,
        "next_expire_time": iso(figures.next_deadline),
        "expired_leases": int(stats.get("expired", 0)),
        "invalidated_leases": int(stats.get("invalidated", 0)),
        "expiry_lag": {"count": int(lag.get("count", 0)), "p50_seconds": float(lag.get("p50", 0.0)),
                       "p99_seconds": float(lag.get("p99", 0.0)), "max_seconds": float(lag.get("max", 0.0))},
    }
