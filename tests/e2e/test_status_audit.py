"""`boomerang status` and `boomerang audit` against a running Boomerang, and every service's
live /metrics: after a three-turn conversation (COLD, then two pulls) the operator's view
and the exported metrics tell the same story as the gateway's response headers. The audit
reads the router's ListTurnPlans and the registry's GetConversation, so turns that
registered nothing are in it too; the demo shows the same trail.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from boomerang.clients.router import RouterClient
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang_tools.demo import show as demo_audit
from rich.console import Console

from tests.support.ministack import MiniStack, converse
from tests.support.procs import BOOMERANG
from tests.support.promnames import dashboard_queries, exported_in_text, referenced

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(database_url: str) -> Iterator[MiniStack]:
    s = MiniStack(database_url, {"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_TRACES_EXPORTER": ""}, reaper=True)
    s.start(metrics=True)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def conversation(stack: MiniStack) -> dict[str, Any]:
    conv = "audit-" + stack.run
    replies = converse(stack, conv, 3)
    return {
        "id": conv,
        "decisions": [r.headers["X-Boomerang-Plan"] for r in replies],
        "reused": [int(r.headers["X-Boomerang-Reused-Tokens"]) for r in replies],
    }


def boomerang(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BOOMERANG, *args], capture_output=True, text=True, timeout=60)


def api_flags(stack: MiniStack) -> list[str]:
    return ["--registry", stack.address("registry"), "--router", stack.address("router"),
            "--reaper", stack.address("reaper")]


def test_the_conversation_reused_the_previous_turns(conversation: dict[str, Any]) -> None:
    assert conversation["decisions"] == ["COLD", "PULL", "PULL"]
    assert conversation["reused"][0] == 0 and all(n > 0 for n in conversation["reused"][1:])


def test_status_from_the_apis(stack: MiniStack, conversation: dict[str, Any]) -> None:
    # The registry's per-engine retained totals may be up to 2 s old (RetainedTotals).
    deadline = time.monotonic() + 10
    while True:
        out = boomerang("status", "--json", *api_flags(stack))
        assert out.returncode == 0, out.stderr
        d = json.loads(out.stdout)
        held = [e["retained_blocks"] for e in d["engines"] if e["engine_id"].endswith(stack.run) and e["role"] == "DECODE"]
        if (held and held[0] > 0) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    engines = {e["role"]: e for e in d["engines"] if e["engine_id"].endswith(stack.run)}
    assert set(engines) == {"PREFILL", "DECODE"}
    assert all(e["status"] == "ACTIVE" and e["generation"] > 0 and e["heartbeat_age_seconds"] < 5 for e in engines.values())
    decode = engines["DECODE"]
    assert decode["retained_blocks"] > 0 and decode["retained_bytes"] == decode["retained_blocks"] * 16 * 262144
    assert {"engine_id": decode["engine_id"], "blocks": decode["retained_blocks"], "bytes": decode["retained_bytes"]} in d["retained"]
    assert d["live_leases"]["by_state"]["RETAINED"] >= 1
    reuse = d["reuse"]
    assert reuse["turns"] >= 3 and reuse["pulled_turns"] >= 2
    assert reuse["reused_tokens"] >= sum(conversation["reused"])  # an upper bound from the leases
    assert {p["engine_id"] for p in d["router"]["pool"] if p["available"]} >= {e["engine_id"] for e in engines.values()}
    assert d["reaper"]["leader_replica_id"] and d["reaper"]["live_leases"] >= 1
    memory = next(e for e in d["memory"]["engines"] if e["engine_id"] == decode["engine_id"])
    assert memory["retained_blocks"] == decode["retained_blocks"] and memory["block_seconds"] > 0
    assert d["memory"]["releases_by_reason"].get("CONSUMED", 0) >= 2  # the two pulled turns

    table = boomerang("status", *api_flags(stack))
    assert table.returncode == 0, table.stderr
    for text in ("Reuse, last 300 s", "Engines", "Leases by state", "Retained per decode engine", "Router pool",
                 "TTL reaper", "Decode memory held", "Releases by reason", decode["engine_id"]):
        assert text in table.stdout, text


def _check_audit(d: dict[str, Any], conversation: dict[str, Any]) -> None:
    assert [t["decision"] for t in d["turns"]] == conversation["decisions"]
    assert [t["reused_tokens"] for t in d["turns"]] == conversation["reused"]
    assert [t["turn"] for t in d["turns"]] == [1, 2, 3]
    assert d["summary"]["not_reused"] == {"COLD NO_LEASE": 1}
    states = {x["turn"]: x["state"] for x in d["leases"]}
    assert states == {1: "CONSUMED", 2: "CONSUMED", 3: "RETAINED"}
    kinds = [e["kind"] for e in d["timeline"]]
    assert kinds.count("PLAN") == 3 and kinds.count("REPORT") == 3
    moves = [e["what"] for e in d["timeline"] if e["kind"] == "LEASE"]
    assert sum("→ CONSUMED" in m for m in moves) == 2 and sum(m.endswith("→ RETAINED") for m in moves) >= 3
    times = [e["time"] for e in d["timeline"]]
    assert times == sorted(times)
    pulls = [e for e in d["timeline"] if e["kind"] == "PLAN" and e["what"].startswith("PULL")]
    assert all("pulls lease" in e["detail"] for e in pulls)


def test_audit_from_the_apis(stack: MiniStack, conversation: dict[str, Any]) -> None:
    out = boomerang("audit", conversation["id"], "--tenant", "anonymous", "--json", "--registry", stack.address("registry"),
                    "--router", stack.address("router"))
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    _check_audit(d, conversation)

    table = boomerang("audit", conversation["id"], "--tenant", "anonymous", "--registry", stack.address("registry"),
                      "--router", stack.address("router"))
    assert table.returncode == 0, table.stderr
    for text in (f"Conversation {conversation['id']}", "Timeline", "PULL", "VERIFIED_PREFIX", "COLD NO_LEASE ×1"):
        assert text in table.stdout, text


async def _computed_turns(stack: MiniStack, conversation: str, n: int) -> list[str]:
    """`n` turns planned and reported with no decode handle: each computed, none registered."""
    ids = []
    async with RouterClient(stack.address("router"), plan_timeout=5.0) as router:
        for i in range(n):
            plan = await router.plan_turn(rtpb.PlanTurnRequest(
                tenant="anonymous", conversation_id=conversation, model=stack.model,
                prompt_token_ids=list(range(1, 50 + i))))
            await router.report_turn(rtpb.ReportTurnRequest(tenant="anonymous", plan_id=plan.plan_id))
            ids.append(plan.plan_id)
    return ids


def test_audit_shows_turns_that_registered_nothing(stack: MiniStack) -> None:
    conv = "computed-" + stack.run
    ids = asyncio.run(_computed_turns(stack, conv, 2))
    out = boomerang("audit", conv, "--tenant", "anonymous", "--json", "--registry", stack.address("registry"),
                    "--router", stack.address("router"))
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert [(t["plan_id"], t["decision"], t["outcome"]) for t in d["turns"]] == [(i, "COLD", "COMPUTED") for i in ids]
    assert d["leases"] == [] and d["summary"]["not_reused"] == {"COLD NO_LEASE": 2}
    assert [e["kind"] for e in d["timeline"]] == ["PLAN", "REPORT", "PLAN", "REPORT"]


def test_the_demo_shows_the_trail_from_the_services(stack: MiniStack, conversation: dict[str, Any]) -> None:
    entries = asyncio.run(demo_audit.trail(stack.address("registry"), stack.address("router"), "anonymous",
                                           conversation["id"]))
    plans = [e.what for e in entries if e.source == "router" and e.what.split(": ", 1)[1].startswith(("COLD", "PULL"))]
    assert plans == ["turn 1: COLD NO_LEASE", "turn 2: PULL VERIFIED_PREFIX", "turn 3: PULL VERIFIED_PREFIX"]
    assert {e.source for e in entries} == {"router", "registry"}
    assert [e.at for e in entries] == sorted(e.at for e in entries)
    console = Console(width=240, record=True)
    console.print(demo_audit.render(entries, conversation["id"], limit=4))
    text = console.export_text()
    assert "ListTurnPlans" in text and "registry" in text and f"{len(entries) - 4} more" in text


def test_operator_errors_are_plain(stack: MiniStack) -> None:
    missing = boomerang("audit", "no-such-conversation", "--tenant", "anonymous", "--registry", stack.address("registry"),
                        "--router", stack.address("router"))
    assert missing.returncode == 1 and "no conversation 'no-such-conversation'" in missing.stderr
    no_tenant = boomerang("audit", "c", "--registry", stack.address("registry"))
    assert no_tenant.returncode == 2 and "--tenant is required" in no_tenant.stderr
    router_down = boomerang("audit", "c", "--tenant", "anonymous", "--registry", stack.address("registry"),
                            "--router", "127.0.0.1:1", "--timeout", "0.5")
    assert router_down.returncode == 1 and "router at 127.0.0.1:1" in router_down.stderr, router_down.stderr
    for command in (["audit", "c", "--tenant", "anonymous"], ["status"]):  # both read the services only
        gone = boomerang(*command, "--database-url", "postgresql://x@127.0.0.1/x")
        assert gone.returncode == 2 and "--database-url" in gone.stderr, command
    down = boomerang("status", "--registry", "127.0.0.1:1", "--timeout", "0.5")
    assert down.returncode == 1 and "127.0.0.1:1" in down.stderr and "Traceback" not in down.stderr


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{name}(\{{[^}}]*\}})? (\S+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total += float(m.group(2))
    return total


def test_every_service_serves_the_metrics_the_dashboard_reads(stack: MiniStack, conversation: dict[str, Any]) -> None:
    pages = {name: httpx.get(f"http://{stack.metrics_address(name)}/metrics", timeout=5).text
             for name in ("registry", "router", "reaper")}
    pages["gateway"] = httpx.get(stack.gateway_url + "/metrics", timeout=5).text
    exported: set[str] = set()
    for text in pages.values():
        exported |= exported_in_text(text)
    missing = referenced(dashboard_queries()) - exported
    assert missing == set(), f"no service serves {sorted(missing)}"

    router = pages["router"]
    assert _metric(router, "boomerang_router_plans_total", decision="PULL") >= 2
    reused = _metric(router, "boomerang_router_reused_prompt_tokens_total")
    assert reused >= sum(conversation["reused"])
    assert _metric(router, "boomerang_router_prefill_seconds_saved_total") == pytest.approx(reused * 0.02061 / 1000, rel=1e-6)
    assert _metric(router, "boomerang_router_recomputed_prompt_tokens_total", decision="COLD") > 0
    assert _metric(router, "boomerang_router_plan_seconds_count") >= 3
    assert _metric(pages["reaper"], "boomerang_reaper_leader") == 1
