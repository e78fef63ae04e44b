"""`boomerang audit --database-url`: a conversation's plans, leases and events from Postgres."""

from __future__ import annotations

from typing import Any

from boomerang.db.engine import make_engine
from sqlalchemy import text

from boomerang_cli.audit_report import build
from boomerang_cli.tables import iso

_TENANT = " AND tenant = :tenant"
PLANS_SQL = """
SELECT plan_id::text AS plan_id, tenant, created_at, decision, reason, prompt_tokens, reused_tokens,
       recomputed_tokens, verified_tokens, prefill_engine_id, decode_engine_id,
       COALESCE(source_engine_id, '') AS source_engine_id, COALESCE(lease_id::text, '') AS lease_id,
       COALESCE(claim_id, '') AS claim_id, reported_at, COALESCE(handle_use, '') AS handle_use,
       COALESCE(claimed_lease_state, '') AS claimed_lease_state, COALESCE(retention, '') AS retention,
       COALESCE(new_lease_id::text, '') AS new_lease_id, COALESCE(outcome, '') AS outcome,
       COALESCE(outcome_detail, '') AS outcome_detail, plan_micros
FROM turn_plans WHERE conversation_id = :conversation{tenant} ORDER BY created_at, plan_id LIMIT 10000
"""
LEASES_SQL = """
SELECT lease_id::text AS lease_id, tenant, state, engine_id, engine_generation, num_tokens, num_blocks,
       created_at, expires_at, updated_at
FROM leases WHERE conversation_id = :conversation{tenant} ORDER BY created_at LIMIT 10000
"""
EVENTS_SQL = """
SELECT lease_id::text AS lease_id, COALESCE(from_state, '') AS from_state, to_state, reason, actor, request_id,
       claim_id, created_at
FROM lease_events WHERE conversation_id = :conversation{tenant} ORDER BY created_at, event_id LIMIT 100000
"""


async def gather_db(url: str, conversation: str, tenant: str | None) -> dict[str, Any]:
    """The audit report from `turn_plans`, `leases` and `lease_events`."""
    params = {"conversation": conversation, "tenant": tenant}
    where = _TENANT if tenant else ""
    engine = make_engine(url, 1, "boomerang-audit")
    try:
        async with engine.connect() as conn:
            plans = [dict(r._mapping) for r in await conn.execute(text(PLANS_SQL.format(tenant=where)), params)]
            leases = [dict(r._mapping) for r in await conn.execute(text(LEASES_SQL.format(tenant=where)), params)]
            events = [dict(r._mapping) for r in await conn.execute(text(EVENTS_SQL.format(tenant=where)), params)]
    finally:
        await engine.dispose()
    for p in plans:
        p["created_at"], p["reported_at"] = iso(p["created_at"]), iso(p["reported_at"])
        for key in ("prompt_tokens", "reused_tokens", "recomputed_tokens", "verified_tokens", "plan_micros"):
            p[key] = int(p[key])
    for x in leases:
        for key in ("created_at", "expires_at", "updated_at"):
            x[key] = iso(x[key])
        x["engine_generation"], x["num_tokens"], x["num_blocks"] = (
            int(x["engine_generation"]), int(x["num_tokens"]), int(x["num_blocks"]))
    for e in events:
        e["time"] = iso(e.pop("created_at"))
    tenants = sorted({p["tenant"] for p in plans} | {x["tenant"] for x in leases})
    notes = [] if tenant or len(tenants) <= 1 else [f"conversation id used by tenants {', '.join(tenants)}"]
    return build("database", conversation, tenant or (tenants[0] if len(tenants) == 1 else None), plans, leases, events, notes)
