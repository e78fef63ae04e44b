"""One conversation's audit trail, read back from the services: every plan and every lease change.

The router's plans (ListTurnPlans) say what was decided for each turn and why; the
registry's lease events (GetConversation) say what happened to each retained turn's blocks.
Merged by time, they tell the story of a conversation: registered, claimed by the next
turn's plan, consumed by the pull, superseded by the next turn's blocks.

The trail is `boomerang audit`'s (boomerang_cli.audit reads it over gRPC from the demo's
running services, audit_report.build merges it): assembled in one place, shown here as a
compact table.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from boomerang_cli.audit import gather_api
from boomerang_cli.tables import parse_iso
from rich.table import Table

# Which service each kind of timeline line comes from.
_SOURCE = {"PLAN": "router", "REPORT": "router", "LEASE": "registry"}


@dataclass(frozen=True)
class Entry:
    """One line of the trail."""

    at: datetime
    source: str  # "router" or "registry"
    what: str
    detail: str


async def trail(registry: str, router: str, tenant: str, conversation_id: str, timeout: float = 5.0) -> list[Entry]:
    """Plans, their reports and lease events of a conversation, in time order (registry and router: addresses)."""
    report = await gather_api(registry, router, conversation_id, tenant, timeout)
    out: list[Entry] = []
    for line in report["timeline"]:
        at = parse_iso(line["time"])
        if at is not None:
            turn = f"turn {line['turn']}: " if line["turn"] else ""
            out.append(Entry(at, _SOURCE[line["kind"]], turn + line["what"], line["detail"]))
    return out


def render(entries: list[Entry], conversation_id: str, limit: int = 16) -> Table:
    """The trail as a table (the first `limit` entries, then a count of the rest)."""
    t = Table(title=f"Audit trail of conversation {conversation_id!r}, from the router's ListTurnPlans and the "
              "registry's GetConversation", title_justify="left", header_style="bold")
    t.add_column("t", justify="right")
    t.add_column("from", no_wrap=True)
    t.add_column("what")
    t.add_column("detail", overflow="fold")
    start = entries[0].at if entries else None
    for entry in entries[:limit]:
        assert start is not None
        t.add_row(f"+{(entry.at - start).total_seconds():.2f}s", entry.source, entry.what, entry.detail)
    if len(entries) > limit:
        plans = sum(1 for e in entries if e.source == "router")
        t.caption = (f"… {len(entries) - limit} more ({plans} plan lines and {len(entries) - plans} "
                     "lease events in all; `boomerang audit` shows every one)")
    return t
