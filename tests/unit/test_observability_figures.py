"""The figures operators read: the router's reuse counters, the reaper's expiry lag, and the
pure parts of `boomerang status` and `boomerang audit` (reuse windows, the timeline)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from boomerang.v1 import types_pb2 as tpb
from boomerang_cli import audit, status
from google.protobuf.timestamp_pb2 import Timestamp
from prometheus_client import REGISTRY
from rich.console import Console


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _record(decision: str, reason: str, prompt: int, reused: int):  # type: ignore[no-untyped-def]
    from boomerang_router.domain import PlanDecision, PlanReason
    from boomerang_router.plan_store import PlanRecord

    return PlanRecord(
        plan_id="p1", created_at=datetime.now(UTC), tenant="acme", conversation_id="c1", model="m",
        request_id="", decision=PlanDecision(decision), reason=PlanReason(reason), prefill_engine_id="P",
        prefill_url="", decode_engine_id="D", decode_url="", prompt_tokens=prompt, reusable_tokens=reused,
        recompute_tokens=prompt - reused, verified_tokens=reused, kv_recompute_threshold=64,
    )


def test_router_counts_reused_and_recomputed_tokens_and_the_time_saved() -> None:
    from boomerang_router.plan_store import observe_plan

    before = (value("boomerang_router_reused_prompt_tokens_total"),
              value("boomerang_router_recomputed_prompt_tokens_total", decision="PULL"),
              value("boomerang_router_recomputed_prompt_tokens_total", decision="COLD"),
              value("boomerang_router_prefill_seconds_saved_total"))
    observe_plan(_record("PULL", "VERIFIED_PREFIX", 2000, 1872))
    observe_plan(_record("COLD", "NO_LEASE", 500, 0))
    after = (value("boomerang_router_reused_prompt_tokens_total"),
             value("boomerang_router_recomputed_prompt_tokens_total", decision="PULL"),
             value("boomerang_router_recomputed_prompt_tokens_total", decision="COLD"),
             value("boomerang_router_prefill_seconds_saved_total"))
    assert [a - b for a, b in zip(after, before)] == pytest.approx([1872, 128, 500, 1872 * 0.02061 / 1000])


def test_reaper_observes_each_expiry_lag() -> None:
    from boomerang_reaper import metrics

    count = value("boomerang_reaper_expiry_lag_seconds_count")
    under_10ms = value("boomerang_reaper_expiry_lag_seconds_bucket", le="0.01")
    expired = value("boomerang_reaper_expired_leases_total")
    metrics.observe_expiries([0.004, 0.2, -0.001])  # a negative lag (clock rounding) counts as 0
    metrics.observe_expiries([])
    assert value("boomerang_reaper_expiry_lag_seconds_count") - count == 3
    assert value("boomerang_reaper_expiry_lag_seconds_bucket", le="0.01") - under_10ms == 2
    assert value("boomerang_reaper_expired_leases_total") - expired == 3


def _ts(epoch: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(epoch * 1e9))
    return ts


def _lease(state: int, created: float, updated: float, tokens: int) -> tpb.Lease:
    return tpb.Lease(state=state, create_time=_ts(created), update_time=_ts(updated), num_tokens=tokens)


def test_reuse_window_from_leases() -> None:
    since = 1000.0
    leases = [
        _lease(tpb.LEASE_STATE_RETAINED, 1100, 1100, 3000),  # this window's last turn
        _lease(tpb.LEASE_STATE_CONSUMED, 1050, 1090, 2000),  # pulled by the turn after it
        _lease(tpb.LEASE_STATE_CONSUMED, 900, 1010, 1000),  # created before, pulled inside the window
        _lease(tpb.LEASE_STATE_CONSUMED, 800, 950, 500),  # pulled before the window
        _lease(tpb.LEASE_STATE_EXPIRED, 400, 1005, 700),
    ]
    w = status.window_from_leases(leases, since)
    assert (w["turns"], w["pulled_turns"], w["reused_tokens"]) == (2, 2, 3000)
    assert w["reuse_rate"] == 1.0
    assert w["ended_leases"] == {"CONSUMED": 2, "EXPIRED": 1, "SUPERSEDED": 0, "INVALIDATED": 0, "RELEASED": 0}
    assert status.window_from_leases([], since)["reuse_rate"] is None


def _plan(plan_id: str, at: str, decision: str, reason: str, new_lease: str, claimed: str = "", reported: str = "") -> dict:
    return {
        "plan_id": plan_id, "tenant": "acme", "created_at": at, "decision": decision, "reason": reason,
        "prompt_tokens": 1000, "reused_tokens": 800 if decision == "PULL" else 0,
        "recomputed_tokens": 200 if decision == "PULL" else 1000, "verified_tokens": 800 if claimed else 0,
        "prefill_engine_id": "P", "decode_engine_id": "D", "source_engine_id": "D" if claimed else "",
        "lease_id": claimed, "reported_at": reported, "handle_use": "READ" if claimed else "",
        "claimed_lease_state": "CONSUMED" if claimed else "", "retention": "REGISTERED" if new_lease else "NO_HANDLE",
        "new_lease_id": new_lease, "outcome": "REUSED" if claimed else "COMPUTED", "outcome_detail": "",
    }


def test_the_audit_timeline_numbers_turns_and_links_leases_to_them() -> None:
    t = "2026-01-01T00:00:0{}.000Z"
    plans = [  # out of order on purpose
        _plan("b", t.format(5), "PULL", "VERIFIED_PREFIX", "L2", claimed="L1", reported=t.format(7)),
        _plan("a", t.format(1), "COLD", "NO_LEASE", "L1", reported=t.format(3)),
        _plan("c", t.format(8), "RECOMPUTE", "PREFIX_MISMATCH", ""),
    ]
    leases = [
        {"lease_id": lid, "state": state, "engine_id": "D", "engine_generation": 1, "num_tokens": 1000,
         "created_at": t.format(n), "expires_at": None, "updated_at": t.format(n)}
        for lid, state, n in (("L1", "CONSUMED", 2), ("L2", "RETAINED", 6))
    ]
    events = [
        {"lease_id": "L1", "from_state": "", "to_state": "RETAINED", "reason": "REGISTERED", "actor": "registry",
         "request_id": "report-a", "claim_id": "", "time": t.format(2)},
        {"lease_id": "L1", "from_state": "RETAINED", "to_state": "CLAIMED", "reason": "CLAIMED", "actor": "registry",
         "request_id": "", "claim_id": "k1", "time": t.format(5)},
        {"lease_id": "L1", "from_state": "CLAIMED", "to_state": "CONSUMED", "reason": "PREFILL_READ", "actor": "registry",
         "request_id": "", "claim_id": "k1", "time": t.format(6)},
    ]
    d = audit.build("database", "c1", "acme", plans, leases, events)
    assert [(p["plan_id"], p["turn"]) for p in d["turns"]] == [("a", 1), ("b", 2), ("c", 3)]
    assert {x["lease_id"]: x["turn"] for x in d["leases"]} == {"L1": 1, "L2": 2}
    assert [(e["kind"], e["turn"]) for e in d["timeline"]] == [
        ("PLAN", 1), ("LEASE", 1), ("REPORT", 1), ("PLAN", 2), ("LEASE", 1), ("LEASE", 1), ("REPORT", 2), ("PLAN", 3)
    ]
    assert d["timeline"][4]["what"] == "lease L1 RETAINED → CLAIMED"
    assert "pulls lease L1 from D" in d["timeline"][3]["detail"]
    assert d["summary"] == {"turns": 3, "pulled_turns": 1, "reused_tokens": 800, "prompt_tokens": 3000,
                            "not_reused": {"COLD NO_LEASE": 1, "RECOMPUTE PREFIX_MISMATCH": 1}}

    console = Console(record=True, width=200)
    for item in audit.render(d):
        console.print(item)
    text = console.export_text()
    assert "Conversation c1 (tenant acme)" in text and "RECOMPUTE PREFIX_MISMATCH ×1" in text


def test_status_renders_every_section() -> None:
    now = 2000.0
    engine = tpb.Engine(engine_id="d0", role=tpb.ENGINE_ROLE_DECODE, model="m", status=tpb.ENGINE_STATUS_ACTIVE,
                        registration_generation=7, bytes_per_block=1 << 20, retained_blocks=30,
                        heartbeat_time=_ts(1999.5), kv_blocks_ttl_seconds=480)
    row = status.engine_row(engine, now)
    assert row["retained_bytes"] == 30 << 20 and row["heartbeat_age_seconds"] == 0.5 and row["role"] == "DECODE"
    reuse = status.window_from_leases([], 0)
    reuse.update(window_seconds=300, saved_prefill_seconds=0.0, partial=False)
    data = {
        "generated_at": "2026-01-01T00:00:00.000Z", "engines": [row], "retained": status.retained_rows([row]),
        "live_leases": {"by_state": {"RETAINED": 3, "CLAIMED": 1}, "partial": False}, "reuse": reuse,
        "router": {"address": "r", "error": "UNAVAILABLE: down"}, "reaper": None,
    }
    console = Console(record=True, width=200)
    for item in status.render(data):
        console.print(item)
    text = console.export_text()
    for wanted in ("Reuse, last 300 s", "Engines", "d0", "30.0 MiB", "RETAINED", "router r", "UNAVAILABLE: down"):
        assert wanted in text, wanted
