"""`boomerang audit --database-url`: a conversation's plans, leases and events from Postgres.

The SQL is the owners' (the router's `turn_plans`, the registry's `leases` and
`lease_events`); this module runs it and hands the rows to audit_report.build, which
assembles the trail for every reader (the API path and the demo too).
"""

from __future__ import annotations

from typing import Any

from boomerang.db.engine import make_engine
from boomerang_registry.inspection import CONVERSATION_EVENTS_SQL, CONVERSATION_LEASES_SQL
from boomerang_router.inspection import CONVERSATION_PLANS_SQL
from sqlalchemy import text

from boomerang_cli.audit_report import build
from boomerang_cli.tables import iso

_TENANT = " AND tenant = :tenant"


async def gather_db(url: str, conversation: str, tenant: str | None) -> dict[str, Any]:
    """The audit report from `turn_plans`, `leases` and `lease_events`."""
    params = {"conversation": conversation, "tenant": tenant}
    where = _TENANT if tenant else ""
    engine = make_engine(url, 1, "boomerang-audit")
    try:
        async with engine.connect() as conn:
            plans = [dict(r._mapping) for r in await conn.execute(text(CONVERSATION_PLANS_SQL.format(tenant=where)), params)]
            leases = [dict(r._mapping) for r in await conn.execute(text(CONVERSATION_LEASES_SQL.format(tenant=where)), params)]
            events = [dict(r._mapping) for r in await conn.execute(text(CONVERSATION_EVENTS_SQL.format(tenant=where)), params)]
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
