"""The audit report of one conversation (`audit.py` reads it from the router and the registry;
the demo shows the same): numbered turns, leases, the merged timeline and a summary."""

from __future__ import annotations

from collections import Counter
from typing import Any


def build(source: str, conversation: str, tenant: str | None, turns: list[dict[str, Any]],
          leases: list[dict[str, Any]], events: list[dict[str, Any]], notes: list[str] | None = None) -> dict[str, Any]:
    """The audit report: numbered turns, leases, the merged timeline and a summary.

    `turns` are plan dicts (`plan_id`, `created_at`, `decision`, `reason`, token counts,
    engines, `lease_id` claimed, `new_lease_id` registered, report fields); `leases` and
    `events` as the registry records them. Times are ISO strings.
    """
    turns = sorted(turns, key=lambda t: (t["created_at"] or "", t["plan_id"]))
    lease_turn: dict[str, int] = {}
    for i, t in enumerate(turns, 1):
        t["turn"] = i
        if t.get("new_lease_id"):
            lease_turn[t["new_lease_id"]] = i
    for lease in leases:
        lease["turn"] = lease_turn.get(lease["lease_id"])
    timeline: list[dict[str, Any]] = []
    for t in turns:
        claimed = f"; pulls lease {t['lease_id'][:8]} from {t['source_engine_id']}" if t.get("lease_id") else ""
        timeline.append({
            "time": t["created_at"], "turn": t["turn"], "kind": "PLAN", "lease_id": t.get("lease_id") or None,
            "what": f"{t['decision']} {t['reason']}",
            "detail": f"{t['reused_tokens']:,} of {t['prompt_tokens']:,} prompt tokens reused, "
                      f"{t['recomputed_tokens']:,} computed (verified prefix {t['verified_tokens']:,}); "
                      f"P={t['prefill_engine_id']} D={t['decode_engine_id']}{claimed}",
        })
        if t.get("reported_at"):
            parts = [f"handle {t['handle_use']}" if t.get("handle_use") else "",
                     f"claimed lease now {t['claimed_lease_state']}" if t.get("claimed_lease_state") else "",
                     f"retention {t['retention']}" if t.get("retention") else "",
                     f"new lease {t['new_lease_id'][:8]}" if t.get("new_lease_id") else "",
                     t.get("outcome_detail") or ""]
            timeline.append({
                "time": t["reported_at"], "turn": t["turn"], "kind": "REPORT", "lease_id": t.get("new_lease_id") or None,
                "what": t.get("outcome") or "REPORTED", "detail": "; ".join(p for p in parts if p),
            })
    for e in events:
        moved = f"{e['from_state']} → {e['to_state']}" if e.get("from_state") else f"→ {e['to_state']}"
        detail = [f"{e['reason']} by {e['actor']}"]
        if e.get("claim_id"):
            detail.append(f"claim {e['claim_id'][:8]}")
        if e.get("request_id"):
            detail.append(f"request {e['request_id']}")
        timeline.append({
            "time": e["time"], "turn": lease_turn.get(e["lease_id"]), "kind": "LEASE", "lease_id": e["lease_id"],
            "what": f"lease {e['lease_id'][:8]} {moved}", "detail": ", ".join(detail),
        })
    order = {"PLAN": 0, "LEASE": 1, "REPORT": 2}
    timeline.sort(key=lambda x: (x["time"] or "", order[x["kind"]]))
    not_reused = Counter(f"{t['decision']} {t['reason']}" for t in turns if t["decision"] != "PULL")
    return {
        "source": source,
        "conversation_id": conversation,
        "tenant": tenant,
        "summary": {
            "turns": len(turns),
            "pulled_turns": sum(1 for t in turns if t["decision"] == "PULL"),
            "reused_tokens": sum(t["reused_tokens"] for t in turns),
            "prompt_tokens": sum(t["prompt_tokens"] for t in turns),
            "not_reused": dict(not_reused.most_common()),
        },
        "turns": turns,
        "leases": leases,
        "timeline": timeline,
        "notes": notes or [],
    }
