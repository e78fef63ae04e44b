"""The prefill hook's live-lease summary: a request the summary rules out goes on at once (no
"ask again later"), its plan sent beside it, claiming nothing; a wrong "no" is counted."""

from __future__ import annotations

from typing import Any

from boomerang.leasekeys import conversation_key, prompt_entry
from boomerang.tokenchain import build_chain, prompt_key
from boomerang.v1 import router_service_pb2 as opb

from tests.support.procs import wait_for
from tests.support.vllm_standin import Request, block_ids_for
from tests.unit import test_vllm_hook_connector as base
from tests.unit.test_vllm_hook_connector import FIRST_TURN, Fakes, extra, prefill_request, pull_plan

connector, fakes = base.connector, base.fakes  # the fixtures


def ready(conn: Any) -> bool:
    return bool(conn.boomerang.stats().get("summary_ready"))


def test_a_conversation_without_a_live_lease_goes_on_at_once(connector: Any, fakes: Fakes) -> None:
    fakes.registry.lease_keys = [conversation_key("acme", "someone-else")]
    conn = connector("p-1", extra("prefill"))
    assert wait_for(lambda: ready(conn), 5)
    req = prefill_request(conversation="new-conv")
    assert conn.get_num_new_matched_tokens(req, 0) == (0, False)  # the first call: no wait
    assert "remote_engine_id" not in (req.kv_transfer_params or {}) or req.kv_transfer_params["remote_engine_id"] is None
    assert wait_for(lambda: conn.boomerang.stats().get("summary_checked") == 1, 5)  # the plan went, beside it
    stats = conn.boomerang.stats()
    assert stats["summary_ruled_out"] == 1 and "summary_false_no" not in stats and "plan_waits" not in stats
    assert wait_for(lambda: len(fakes.background.reports) == 1, 5)  # its plan is settled
    assert fakes.background.reports[0].plan_id == "p-cold"


def test_a_conversation_with_a_live_lease_waits_for_its_plan(connector: Any, fakes: Fakes) -> None:
    fakes.registry.lease_keys = [conversation_key("acme", "c-1")]
    fakes.router.planner = lambda req: pull_plan(96)
    conn = connector("p-1", extra("prefill"))
    assert wait_for(lambda: ready(conn), 5)
    req = prefill_request(conversation="c-1")
    assert conn.get_num_new_matched_tokens(req, 0) == (None, False)  # the plan is awaited
    assert wait_for(lambda: conn.get_num_new_matched_tokens(req, 0) == (96, True), 5)
    assert "summary_ruled_out" not in conn.boomerang.stats()


def test_a_wrong_no_is_counted_and_the_plan_beside_claims_nothing(connector: Any, fakes: Fakes) -> None:
    fakes.registry.lease_keys = []  # the summary is behind: the lease it misses is there
    asked: list[opb.PlanTurnRequest] = []

    def started(req: opb.PlanTurnRequest) -> opb.PlanTurnResponse:  # the router's answer to a started turn
        asked.append(req)
        return opb.PlanTurnResponse(plan_id="plan-1", decision=opb.PLAN_DECISION_RECOMPUTE,
                                    reason=opb.PLAN_REASON_TURN_STARTED, verified_prefix_tokens=96)

    fakes.router.planner = started
    conn = connector("p-1", extra("prefill"))
    assert wait_for(lambda: ready(conn), 5)
    req = prefill_request(conversation="c-1")
    assert conn.get_num_new_matched_tokens(req, 0) == (0, False)
    assert wait_for(lambda: conn.boomerang.stats().get("summary_false_no") == 1, 5)
    assert [r.turn_started for r in asked] == [True]
    assert wait_for(lambda: len(fakes.background.reports) == 1, 5)
    report = fakes.background.reports[0]
    assert (report.plan_id, report.handle_use) == ("plan-1", opb.HANDLE_USE_UNSPECIFIED)


def test_a_turn_it_prefilled_makes_its_next_turn_a_maybe(connector: Any, fakes: Fakes) -> None:
    fakes.registry.lease_keys = []
    conn = connector("p-1", extra("prefill"))
    assert wait_for(lambda: ready(conn), 5)
    req = prefill_request(conversation="c-1")
    assert conn.get_num_new_matched_tokens(req, 0) == (0, False)
    req.status = "FINISHED_LENGTH_CAPPED"
    conn.request_finished_all_groups(req, block_ids_for(100, 16))
    nxt = prefill_request(rid="p-req-2", conversation="c-1", tokens=200)
    assert conn.get_num_new_matched_tokens(nxt, 0) == (None, False)  # D registers the turn: worth a plan


def test_without_an_id_only_a_prompt_continuing_a_live_lease_is_a_maybe(connector: Any, fakes: Fakes) -> None:
    previous = list(range(1000, 1100))
    key = prompt_key(build_chain(previous, 16), len(previous))
    assert key is not None
    fakes.registry.lease_keys = [prompt_entry("acme", key)]
    conn = connector("p-1", extra("prefill"))
    assert wait_for(lambda: ready(conn), 5)
    fresh = Request("p-fresh", list(range(5000, 5100)), dict(FIRST_TURN))
    assert conn.get_num_new_matched_tokens(fresh, 0) == (0, False)
    follow = Request("p-follow", previous + list(range(7000, 7050)), dict(FIRST_TURN))
    assert conn.get_num_new_matched_tokens(follow, 0) == (None, False)


def test_without_a_summary_every_request_is_planned(connector: Any, fakes: Fakes) -> None:
    conn = connector("p-1", extra("prefill", lease_summary=False))
    req = prefill_request(conversation="c-1")
    assert conn.get_num_new_matched_tokens(req, 0) == (None, False)
    assert "summary_ready" not in conn.boomerang.stats()
