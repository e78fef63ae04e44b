"""`boomerang status`'s decode memory: block-seconds per engine, releases by reason, reuse lost.

Retained blocks say how much decode memory leases hold now; block-seconds say what holding
it cost over the window (a lease's blocks × the part of its life inside the window, ending
when the lease ended: D is told to free an ended lease on its next heartbeat). Releases by
state say why leases ended (read, superseded, expired, invalidated, released early); the
gateway's misses (`LEASE_RELEASED`) count the reuse lost to an early release.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from boomerang.v1 import types_pb2 as tpb
from boomerang_server.leases import LIVE_STATES

from boomerang_cli.tables import table

# Why a lease ended, in the order the report lists them.
END_REASONS = ("CONSUMED", "SUPERSEDED", "EXPIRED", "INVALIDATED", "RELEASED")


def _epoch(ts: Any) -> float:
    return float(ts.seconds + ts.nanos / 1e9)


def block_seconds_from_leases(leases: Iterable[Any], since: float, now: float) -> dict[str, float]:
    """Block-seconds per engine held inside [since, now] by these `Lease` messages (each counted once)."""
    seen: set[str] = set()
    out: dict[str, float] = {}
    for lease in leases:
        if lease.lease_id in seen:
            continue
        seen.add(lease.lease_id)
        state = tpb.LeaseState.Name(lease.state).removeprefix("LEASE_STATE_")
        end = now if state in LIVE_STATES else min(now, _epoch(lease.update_time))
        start = max(since, _epoch(lease.create_time))
        blocks = sum(len(g.block_ids) for g in lease.block_groups)
        if end > start and blocks:
            out[lease.engine_id] = out.get(lease.engine_id, 0.0) + blocks * (end - start)
    return out


def memory_section(
    retained: list[dict[str, Any]],
    block_seconds: Mapping[str, float],
    ended: Mapping[str, int],
    window: float,
) -> dict[str, Any]:
    """The report's `memory` part: per decode engine (from `retained_rows`) and leases ended by state."""
    return {
        "window_seconds": window,
        "engines": [
            {"engine_id": r["engine_id"], "retained_blocks": r["blocks"],
             "block_seconds": round(float(block_seconds.get(r["engine_id"], 0.0)), 1)}
            for r in retained
        ],
        "releases_by_reason": {k: int(ended[k]) for k in END_REASONS if ended.get(k)},
    }


def render_memory(m: dict[str, Any] | None) -> list[Any]:
    """The memory tables, when the report has them."""
    if not m:
        return []
    window = f"last {m['window_seconds']:.0f} s"
    return [
        table(f"Decode memory held, {window}", ["engine", "retained blocks", "block-seconds"],
              [[e["engine_id"], e["retained_blocks"], f"{e['block_seconds']:,.0f}"] for e in m["engines"]],
              caption="leases' blocks × their life in the window (from the leases listed)"),
        table(f"Releases by reason, {window}", ["reason", "leases"],
              [[k, n] for k, n in m["releases_by_reason"].items()] or [["none", 0]],
              caption="reuse lost to an early release: the gateway's misses (LEASE_RELEASED)"),
    ]
