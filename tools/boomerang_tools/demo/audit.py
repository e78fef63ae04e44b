"""One conversation's audit trail, read back from Postgres: every plan and every lease change.

`turn_plans` (the router) says what was decided for each turn and why; `lease_events` (the
registry, append-only) says what happened to each retained turn's blocks. Merged by time,
they tell the story of a conversation: registered, claimed by the next turn's plan,
consumed by the pull, superseded by the next turn's blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg
from rich.table import Table

PLANS_SQL = """
SELECT created_at, decision, reason, prompt_tokens, reused_tokens, plan_micros, retention
FROM turn_plans WHERE tenant = $1 AND conversation_id = $2 ORDER BY created_at
"""
EVENTS_SQL = """
SELECT e.created_at, e.lease_id::text AS lease_id, e.from_state, e.to_state, e.reason, e.actor,
       l.num_tokens, l.engine_id
FROM lease_events e LEFT JOIN leases l ON l.lease_id = e.lease_id
WHERE e.tenant = $1 AND e.conversation_id = $2 ORDER BY e.created_at, e.event_id
"""


@dataclass(frozen=True)
class Entry:
    """One line of the trail."""

    at: datetime
    source: str  # "plan" or "lease"
    what: str
    detail: str


async def trail(database_url: str, tenant: str, conversation_id: str) -> list[Entry]:
    """Plans and lease events of a conversation, in time order."""
    dsn = database_url.replace("postgresql+asyncpg://", "postgresql://")
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        plans = await conn.fetch(PLANS_SQL, tenant, conversation_id)
        events = await conn.fetch(EVENTS_SQL, tenant, conversation_id)
    finally:
        await conn.close()
    out = [
        Entry(p["created_at"], "plan", f"{p['decision']} {p['reason']}",
              f"prompt {p['prompt_tokens']:,}, pull {p['reused_tokens']:,}; {p['plan_micros'] / 1000:.1f} ms")
        for p in plans
    ]
    for e in events:
        move = f"{e['from_state'] or '·'} → {e['to_state']}"
        size = f", {e['num_tokens']:,} tokens" if e["num_tokens"] is not None else ""
        why = f" ({e['reason']})" if e["reason"] != e["to_state"] else ""  # REGISTERED → RETAINED says it all
        out.append(Entry(e["created_at"], "lease", move, f"lease {e['lease_id'][:8]}{size}{why}"))
    out.sort(key=lambda entry: (entry.at, entry.source != "plan"))
    return out


def render(entries: list[Entry], conversation_id: str, limit: int = 16) -> Table:
    """The trail as a table (the first `limit` entries, then a count of the rest)."""
    t = Table(title=f"Audit trail of conversation {conversation_id!r}, from Postgres",
              title_justify="left", header_style="bold")
    t.add_column("t", justify="right")
    t.add_column("table", no_wrap=True)
    t.add_column("what")
    t.add_column("detail", overflow="fold")
    start = entries[0].at if entries else None
    for entry in entries[:limit]:
        assert start is not None
        t.add_row(f"+{(entry.at - start).total_seconds():.2f}s", "turn_plans" if entry.source == "plan" else "lease_events",
                  entry.what, entry.detail)
    if len(entries) > limit:
        plans = sum(1 for e in entries if e.source == "plan")
        t.caption = f"… {len(entries) - limit} more ({plans} plans and {len(entries) - plans} lease events in all)"
    return t
