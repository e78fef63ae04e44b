"""`boomerang audit CONVERSATION`: one conversation's turns as a timeline.

Every plan (decision and reason, tokens pulled and computed, engines), every report
(what the prefill engine did with the handle, what became of the decode engine's blocks)
and every lease event (who moved which lease from which state to which, and why), in
time order, numbered by turn — so an operator sees at once why a turn did not reuse.

It reads the services that own the records (docs/design.md, "Who owns which table"): the
router's ListTurnPlans for every plan of the conversation (turns that registered nothing
too) and the registry's GetConversation for its leases and their events. A conversation
with plans but no lease (every turn computed, nothing retained) is no error; one with
neither is. The demo shows the same report (`gather_api`).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any

from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient
from boomerang.clients.router import RouterClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import types_pb2 as tpb

from boomerang_cli.context import add_source_flags, resolve_sources, service_target
from boomerang_cli.failures import run_against
from boomerang_cli.tables import emit, iso, short_time, table

PAGE_SIZE = 1000
MAX_PAGES = 20  # × PAGE_SIZE plans; beyond that the report says it shows the oldest only
LEASE_LIMIT = 100  # the registry's GetConversation answers with a conversation's newest 100 leases


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `audit` subcommand."""
    parser = subparsers.add_parser(
        "audit",
        help="show one conversation's turns: plans, decisions with reasons, leases and every event",
        description="A conversation's turns as a timeline, from the router's plans and the registry's leases.",
    )
    parser.add_argument("conversation", metavar="CONVERSATION", help="the conversation id")
    parser.add_argument("--tenant", help="the tenant (default the `boomerang up` context's anonymous tenant, "
                        "else required)")
    add_source_flags(parser, reaper=False)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    # Failures go up to `boomerang`'s one place (failures.py), named after whom they were talking to.
    origin = resolve_sources(args, "registry", "router")
    if not args.tenant:
        print("boomerang audit: --tenant is required (no `boomerang up` context in this folder names one)",
              file=sys.stderr)
        return 2
    leases, events = run_against(service_target("registry", args.registry, origin),
                                 conversation_leases(args.registry, args.conversation, args.tenant, args.timeout))
    notes: list[str] = []
    turns: list[dict[str, Any]] = []
    if args.router:
        turns, notes = run_against(service_target("router", args.router, origin),
                                   conversation_plans(args.router, args.conversation, args.tenant, args.timeout))
    else:
        notes.append("plans omitted (--router '')")
    if len(leases) >= LEASE_LIMIT:
        notes.append(f"the newest {LEASE_LIMIT} leases only (GetConversation's limit); every lease event")
    if not turns and not leases:
        print(f"boomerang audit: no conversation {args.conversation!r} for tenant {args.tenant!r} "
              f"(a tenant other than {args.tenant!r}? give --tenant)", file=sys.stderr)
        return 1
    emit(build("api", args.conversation, args.tenant, turns, leases, events, notes), args.json, render)
    return 0


# -- from the APIs -----------------------------------------------------------------------------


def _name(enum: Any, value: int, prefix: str) -> str:
    """An enum value's name without its prefix; "" for the unspecified zero."""
    return "" if value == 0 else enum.Name(value).removeprefix(prefix)


def plan_dict(p: Any) -> dict[str, Any]:
    """A router `TurnPlan` as the report's plan dict."""
    return {
        "plan_id": p.plan_id, "tenant": p.tenant, "created_at": iso(p.create_time),
        "decision": _name(rtpb.PlanDecision, p.decision, "PLAN_DECISION_"),
        "reason": _name(rtpb.PlanReason, p.reason, "PLAN_REASON_"),
        "prompt_tokens": p.prompt_tokens, "reused_tokens": p.reusable_tokens, "recomputed_tokens": p.recompute_tokens,
        "verified_tokens": p.verified_prefix_tokens,
        "prefill_engine_id": p.prefill_engine.engine_id, "decode_engine_id": p.decode_engine.engine_id,
        "source_engine_id": p.source_engine_id, "lease_id": p.lease_id, "claim_id": p.claim_id,
        "reported_at": iso(p.report_time),
        "handle_use": _name(rtpb.HandleUse, p.handle_use, "HANDLE_USE_"),
        "claimed_lease_state": _name(tpb.LeaseState, p.claimed_lease_state, "LEASE_STATE_"),
        "retention": _name(rtpb.RetentionOutcome, p.retention, "RETENTION_OUTCOME_"),
        "new_lease_id": p.new_lease_id, "outcome": p.outcome, "outcome_detail": p.outcome_detail,
    }


async def conversation_leases(
    registry: str, conversation: str, tenant: str, timeout: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The conversation's leases and their events, from the registry's GetConversation (none: [], [])."""
    def state(value: int) -> str:
        return _name(tpb.LeaseState, value, "LEASE_STATE_")

    async with RegistryClient(registry, timeout=timeout) as reg:
        try:
            conv = await reg.get_conversation(
                rpb.GetConversationRequest(tenant=tenant, conversation_id=conversation, include_events=True)
            )
        except BoomerangClientError as exc:
            if exc.code == "NOT_FOUND":  # no lease: every turn computed, or no such conversation
                return [], []
            raise
    leases = [
        {"lease_id": x.lease_id, "tenant": x.tenant, "state": state(x.state), "engine_id": x.engine_id,
         "engine_generation": x.engine_generation, "num_tokens": x.num_tokens,
         "num_blocks": sum(len(g.block_ids) for g in x.block_groups),
         "created_at": iso(x.create_time), "expires_at": iso(x.expire_time), "updated_at": iso(x.update_time)}
        for x in conv.leases
    ]
    events = [
        {"lease_id": e.lease_id, "from_state": state(e.from_state), "to_state": state(e.to_state), "reason": e.reason,
         "actor": e.actor, "request_id": e.request_id, "claim_id": e.claim_id, "time": iso(e.event_time)}
        for e in conv.events
    ]
    return leases, events


async def conversation_plans(router: str, conversation: str, tenant: str, timeout: float) -> tuple[list[dict[str, Any]], list[str]]:
    """Every plan of the conversation, oldest first, from the router's ListTurnPlans; and notes."""
    plans: list[dict[str, Any]] = []
    req = rtpb.ListTurnPlansRequest(tenant=tenant, conversation_id=conversation, page_size=PAGE_SIZE)
    async with RouterClient(router, timeout=timeout) as rt:
        for _ in range(MAX_PAGES):
            page = await rt.list_turn_plans(req)
            plans += [plan_dict(p) for p in page.plans]
            if not page.next_page_token:
                return plans, []
            req.page_token = page.next_page_token
    return plans, [f"the oldest {len(plans):,} plans only (the conversation has more)"]


async def gather_api(registry: str, router: str, conversation: str, tenant: str, timeout: float) -> dict[str, Any]:
    """The audit report from the registry's GetConversation and the router's ListTurnPlans."""
    leases, events = await conversation_leases(registry, conversation, tenant, timeout)
    turns, notes = await conversation_plans(router, conversation, tenant, timeout)
    return build("api", conversation, tenant, turns, leases, events, notes)


# -- the report ------------------------------------------------------------------------------


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


# -- rendering ---------------------------------------------------------------------------------


def render(d: dict[str, Any]) -> list[Any]:
    """The summary, the turns, the leases and the timeline as tables."""
    s = d["summary"]
    who = f" (tenant {d['tenant']})" if d["tenant"] else ""
    why = ", ".join(f"{k} ×{v}" for k, v in s["not_reused"].items()) or "none"
    out: list[Any] = [table(
        f"Conversation {d['conversation_id']}{who}",
        ["turns", "pulled", "tokens reused", "prompt tokens", "not reused because"],
        [[s["turns"], s["pulled_turns"], s["reused_tokens"], s["prompt_tokens"], why]],
        caption="; ".join(d["notes"]),
    )]
    out.append(table(
        "Turns",
        ["#", "planned", "decision", "reason", "reused", "computed", "P", "D", "outcome", "retention"],
        [[t["turn"], short_time(t["created_at"]), t["decision"], t["reason"], t["reused_tokens"], t["recomputed_tokens"],
          t["prefill_engine_id"], t["decode_engine_id"], t.get("outcome") or "", t.get("retention") or ""]
         for t in d["turns"]],
    ))
    out.append(table(
        "Leases",
        ["lease", "turn", "state", "engine", "gen", "tokens", "created", "expires", "updated"],
        [[x["lease_id"][:8], x.get("turn") or "", x["state"], x["engine_id"], str(x["engine_generation"]), x["num_tokens"],
          short_time(x["created_at"]), short_time(x["expires_at"]), short_time(x["updated_at"])]
         for x in sorted(d["leases"], key=lambda x: x["created_at"] or "")],
    ))
    out.append(table(
        "Timeline",
        ["time (UTC)", "turn", "kind", "what", "detail"],
        [[short_time(e["time"]), e["turn"] or "", e["kind"], e["what"], e["detail"]] for e in d["timeline"]],
    ))
    return out

