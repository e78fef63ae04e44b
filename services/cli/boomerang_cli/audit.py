"""`boomerang audit CONVERSATION`: one conversation's turns as a timeline.

Every plan (decision and reason, tokens pulled and computed, engines), every report
(what the prefill engine did with the handle, what became of the decode engine's blocks)
and every lease event (who moved which lease from which state to which, and why), in
time order, numbered by turn — so an operator sees at once why a turn did not reuse.

With `--database-url` it reads `turn_plans`, `leases` and `lease_events`. From the APIs it
reads the registry's GetConversation (leases and events) and, for each plan id a lease
names (the router registers a turn's blocks with request id `report-<plan id>`), the
router's GetTurnPlan; turns that registered nothing are only in the database.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient
from boomerang.clients.router import RouterClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import types_pb2 as tpb

from boomerang_cli.audit_db import gather_db
from boomerang_cli.audit_report import build
from boomerang_cli.failures import database_target, run_against
from boomerang_cli.sources import add_source_flags, resolve_sources, service_target
from boomerang_cli.tables import emit, iso, short_time, table

REPORT_PREFIX = "report-"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `audit` subcommand."""
    parser = subparsers.add_parser(
        "audit",
        help="show one conversation's turns: plans, decisions with reasons, leases and every event",
        description="A conversation's turns as a timeline, from Postgres (--database-url) or the services' APIs.",
    )
    parser.add_argument("conversation", metavar="CONVERSATION", help="the conversation id")
    parser.add_argument("--tenant", help="the tenant (with the APIs: default the `boomerang up` context's anonymous "
                        "tenant, else required; with --database-url, default every tenant)")
    add_source_flags(parser, reaper=False)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    # Failures go up to `boomerang`'s one place (failures.py), named after whom they were talking to.
    if args.database_url:
        data = run_against(database_target(args.database_url),
                           gather_db(args.database_url, args.conversation, args.tenant))
    else:
        origin = resolve_sources(args, "registry", "router")
        if not args.tenant:
            print("boomerang audit: --tenant is required when reading the services' APIs (no `boomerang up` context "
                  "in this folder names one; or give --database-url)", file=sys.stderr)
            return 2
        try:
            data = run_against(service_target("registry", args.registry, origin),
                               gather_api(args.registry, args.router, args.conversation, args.tenant, args.timeout))
        except Exception as exc:
            cause = exc.__cause__
            if isinstance(cause, BoomerangClientError) and cause.code == "NOT_FOUND":
                print(f"boomerang audit: no conversation {args.conversation!r} for tenant {args.tenant!r} "
                      f"(a tenant other than {args.tenant!r}? give --tenant)", file=sys.stderr)
                return 1
            raise
    if not data["turns"] and not data["leases"]:
        print(f"boomerang audit: nothing recorded for conversation {args.conversation!r}", file=sys.stderr)
        return 1
    emit(data, args.json, render)
    return 0


# -- the timeline (pure) -----------------------------------------------------------------------


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


async def gather_api(registry: str, router: str, conversation: str, tenant: str, timeout: float) -> dict[str, Any]:
    """The report from the registry's GetConversation and the router's GetTurnPlan."""
    def state(value: int) -> str:
        return _name(tpb.LeaseState, value, "LEASE_STATE_")

    async with RegistryClient(registry, timeout=timeout) as reg:
        conv = await reg.get_conversation(
            rpb.GetConversationRequest(tenant=tenant, conversation_id=conversation, include_events=True)
        )
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
    plan_ids = list(dict.fromkeys(
        e["request_id"][len(REPORT_PREFIX):] for e in events
        if e["request_id"].startswith(REPORT_PREFIX) and not e["request_id"].endswith("-engine")
    ))
    turns: list[dict[str, Any]] = []
    notes = ["plans come from the router for turns that registered a lease; --database-url lists every plan"]
    if router and plan_ids:
        try:
            async with RouterClient(router, timeout=timeout) as rt:
                for plan_id in plan_ids:
                    try:
                        got = await rt.get_turn_plan(rtpb.GetTurnPlanRequest(tenant=tenant, plan_id=plan_id))
                        turns.append(plan_dict(got.plan))
                    except BoomerangClientError as exc:
                        if exc.code != "NOT_FOUND":
                            raise
                        notes.append(f"plan {plan_id} not found at the router")
        except BoomerangClientError as exc:
            notes.append(f"router {router}: {exc.code}: {exc.error.message}; plans omitted")
    return build("api", conversation, tenant, turns, leases, events, notes)


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

