"""The campaign's invariants, each counted from what the clients, the engines and Postgres recorded.

- requests failed: attempts that got no reply, except those a fault explains (the attempt's
  gateway, or an engine, killed while it ran; a refused connection, when a gateway is down, sends
  the turn to the other). A turn may recompute, never fail.
- leases claimed twice: in the audit trail (a lease CLAIMED again after a claim it never gave
  back), and at the engines (a decode handle presented to a prefill engine again after a pull
  used it up, which the trail cannot show when a failover lost the first claim).
- corrupt pulls and loads: KV that did not match the prompt (the engines compare every token).
- reads of released or freed blocks: pulls or loads of a handle the decode engine had freed.
- acknowledged registrations lost: a turn served, its decode engine retained it, the gateway's
  report was answered (its log names no failed or unanswered report for the plan), and no lease
  row for it is left, in any state.
- served turns without their plan in the audit trail (turn_plans).
- reuse back after the last fault: seconds from its end to the first turn that PULLed.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from boomerang_tools.chaos.agents import Attempt
from boomerang_tools.chaos.faults import Ran

REUSE_BACK_SECONDS = 10.0
CONSUMING = ("ok", "corrupt", "below_threshold")  # a pull outcome that used D's handle up (and garbage_*)


@dataclass
class Check:
    """One invariant and its count."""

    name: str
    count: float
    ok: bool
    detail: str = ""


def read_ledgers(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every engine's ledger lines (a line cut by a SIGKILL is skipped)."""
    out = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _kills(ran: list[Ran], kind: str) -> list[tuple[float, float, str]]:
    return [(r.started, r.ended, r.fault.target) for r in ran if r.fault.kind == "kill" and r.fault.target.startswith(kind)]


def failed_requests(attempts: list[Attempt], ran: list[Ran], gateways: dict[str, str]) -> tuple[list[Attempt], int]:
    """Attempts that failed with no fault to explain it, and how many failed explained by one.

    A refused connection is no failure: nothing reached that gateway, and the agent tries the
    other (when both refuse, no gateway is up). A failure is explained when the attempt's own
    gateway (`gateways`: name to base URL), or an engine, was killed while it ran.
    """
    gateway_kills = [(s, e, gateways[t]) for s, e, t in _kills(ran, "gateway-")]
    engine_kills = _kills(ran, "sim-")
    unexplained, explained = [], 0
    for a in attempts:
        if a.ok or a.refused:
            continue
        during = [(s, e, t) for s, e, t in engine_kills if s <= a.ended and a.started <= e]
        during += [(s, e, t) for s, e, t in gateway_kills if t == a.gateway and s <= a.ended and a.started <= e]
        if during:
            explained += 1
        else:
            unexplained.append(a)
    return unexplained, explained


def double_claims_at_engines(ledger: list[dict[str, Any]]) -> list[str]:
    """Decode handles presented to a prefill engine again after a pull used them up."""
    by_handle: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for e in ledger:
        if e.get("kind") == "pull":
            by_handle[(str(e.get("remote_engine_id")), str(e.get("remote_request_id")))].append(e)
    found = []
    for handle, events in by_handle.items():
        used = False
        for e in sorted(events, key=lambda e: e["at"]):
            if used:
                found.append(f"{handle[1]} on {handle[0]}: presented again ({e['outcome']}) after it was used")
                break
            outcome = str(e.get("outcome", ""))
            used = outcome in CONSUMING or outcome.startswith("garbage_")
    return found


async def database_checks(url: str, served: list[Attempt], acknowledged: list[Attempt]) -> dict[str, Any]:
    """Double claims in the trail, plans missing from turn_plans, acknowledged registrations lost."""
    conn = await _connect(url)
    try:
        doubles = await conn.fetch(
            "SELECT lease_id::text, count(*) FILTER (WHERE to_state = 'CLAIMED') AS claims, "
            "count(*) FILTER (WHERE from_state = 'CLAIMED' AND to_state = 'RETAINED') AS returns "
            "FROM lease_events GROUP BY lease_id "
            "HAVING count(*) FILTER (WHERE to_state = 'CLAIMED') "
            "- count(*) FILTER (WHERE from_state = 'CLAIMED' AND to_state = 'RETAINED') > 1")
        plan_ids = [a.plan_id for a in served if a.plan_id]
        have = {r[0] for r in await conn.fetch(
            "SELECT plan_id::text FROM turn_plans WHERE plan_id = ANY($1::uuid[])", plan_ids)}
        wanted = [f"chatcmpl-{a.request_id}" for a in acknowledged]
        leases = {r[0]: r[1] for r in await conn.fetch(
            "SELECT remote_request_id, state FROM leases WHERE remote_request_id = ANY($1::text[])", wanted)}
        invalidated = {r[0] for r in await conn.fetch(
            "SELECT l.remote_request_id FROM leases l JOIN lease_events e ON e.lease_id = l.lease_id "
            "WHERE l.remote_request_id = ANY($1::text[]) AND e.to_state = 'INVALIDATED' AND e.reason <> ''", wanted)}
    finally:
        await conn.close()
    return {
        "double_claims": [f"{r[0]}: claimed {r[1]}, given back {r[2]}" for r in doubles],
        "plans_missing": [p for p in plan_ids if p not in have],
        "registrations_lost": [w for w in wanted if w not in leases],
        "invalidated_without_reason": [w for w, s in leases.items() if s == "INVALIDATED" and w not in invalidated],
        "lease_states": dict(Counter(leases.values())),
    }


async def _connect(url: str, patience: float = 120.0) -> asyncpg.Connection:
    """A connection to the primary, waiting (bounded) while Postgres settles after the last fault."""
    deadline = asyncio.get_running_loop().time() + patience
    while True:
        try:
            return await asyncpg.connect(url, timeout=10)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(2)


def acknowledged(served: list[Attempt], ledger: list[dict[str, Any]], gateway_logs: str) -> list[Attempt]:
    """Served turns whose decode engine retained them and whose report the gateway saw answered."""
    retained = {e["request_id"] for e in ledger if e.get("kind") == "retained"}
    out = []
    for a in served:
        if not a.plan_id or f"chatcmpl-{a.request_id}" not in retained:
            continue
        if f"ReportTurn {a.plan_id}" in gateway_logs or f"turn {a.plan_id} ended before" in gateway_logs:
            continue  # failed, rejected or unanswered in time: not acknowledged
        out.append(a)
    return out


def reuse_back(attempts: list[Attempt], ran: list[Ran]) -> float:
    """Seconds from the end of the last fault to the first PULL after it (inf if none)."""
    last = max((r.ended for r in ran), default=0.0)
    pulls = [a.started for a in attempts if a.ok and a.plan == "PULL" and a.started >= last]
    return (min(pulls) - last) if pulls else float("inf")
