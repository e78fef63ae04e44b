"""One conversation's audit trail, read back from Postgres: every plan and every lease change.

`turn_plans` (the router) says what was decided for each turn and why; `lease_events` (the
registry, append-only) says what happened to each retained turn's blocks. Merged by time,
they tell the story of a conversation: registered, claimed by the next turn's plan,
consumed by the pull, superseded by the next turn's blocks.

The trail is `boomerang audit --database-url`'s (boomerang_cli.audit_db, which runs the
owning services' SQL, and audit_report.build, which merges it): assembled in one place,
shown here as a compact table.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from boomerang_cli.audit_db import gather_db
from boomerang_cli.tables import parse_iso
from rich.table import Table

# Where each kind of timeline line is recorded.
_TABLE = {"PLAN": "turn_plans", "REPORT": "turn_plans", "LEASE": "lease_events"}


@dataclass(frozen=True)
class Entry:
    """One line of the trail."""

    at: datetime
    source: str  # "turn_plans" or "lease_events"
    what: str
    detail: str


async def trail(database_url: str, tenant: str, conversation_id: str) -> list[Entry]:
    """Plans, their reports and lease events of a conversation, in time order."""
    report = await gather_db(database_url, conversation_id, tenant)
    out: list[Entry] = []
    for line in report["timeline"]:
        at = parse_iso(line["time"])
        if at is not None:
            turn = f"turn {line['turn']}: " if line["turn"] else ""
            out.append(Entry(at, _TABLE[line["kind"]], turn + line["what"], line["detail"]))
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
        t.add_row(f"+{(entry.at - start).total_seconds():.2f}s", entry.source, entry.what, entry.detail)
    if len(entries) > limit:
        plans = sum(1 for e in entries if e.source == "turn_plans")
        t.caption = (f"… {len(entries) - limit} more ({plans} plan lines and {len(entries) - plans} "
                     "lease events in all; `boomerang audit` shows every one)")
    return t
