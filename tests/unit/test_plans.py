"""The one reader of PlanTurn answers, shared by the gateway and the vLLM hook."""

from __future__ import annotations

import json

from boomerang import plans
from boomerang.v1 import router_service_pb2 as opb

PARAMS = {"do_remote_prefill": True, "remote_block_ids": [[1, 2]], "remote_engine_id": "d"}


def _answer(decision: int, params: str = "", reason: int = 0) -> opb.PlanTurnResponse:
    return opb.PlanTurnResponse(decision=decision, kv_transfer_params_json=params, reason=reason)  # type: ignore[arg-type]


def test_a_pull_carries_its_params_and_other_decisions_none() -> None:
    pull = _answer(opb.PLAN_DECISION_PULL, json.dumps(PARAMS), opb.PLAN_REASON_VERIFIED_PREFIX)
    assert (plans.decision_name(pull), plans.reason_name(pull), plans.pull_params(pull)) == (
        "PULL", "VERIFIED_PREFIX", PARAMS)
    cold = _answer(opb.PLAN_DECISION_COLD, json.dumps(PARAMS))
    assert plans.pull_params(cold) is None and plans.usable(cold)
    assert plans.usable(_answer(opb.PLAN_DECISION_RECOMPUTE))


def test_unusable_answers_say_so_without_raising() -> None:
    for bad in ("{not json", "[1, 2]", ""):
        answer = _answer(opb.PLAN_DECISION_PULL, bad)
        assert plans.pull_params(answer) is None and not plans.usable(answer), bad
    unspecified = _answer(opb.PLAN_DECISION_UNSPECIFIED, "{}")
    assert plans.decision_name(unspecified) == "UNSPECIFIED" and not plans.usable(unspecified)
    newer = _answer(99, "{}", reason=77)  # a decision a newer router may send
    assert (plans.decision_name(newer), plans.reason_name(newer), plans.usable(newer)) == ("UNKNOWN_99", "UNKNOWN_77", False)


def test_reused_tokens_only_of_plans_that_spare_the_prefill() -> None:
    pull = opb.PlanTurnResponse(decision=opb.PLAN_DECISION_PULL, kv_transfer_params_json=json.dumps(PARAMS),
                                reusable_tokens=96)
    on_decode = opb.PlanTurnResponse(decision=opb.PLAN_DECISION_PREFILL_ON_DECODE, reusable_tokens=64)
    recompute = opb.PlanTurnResponse(decision=opb.PLAN_DECISION_RECOMPUTE, reusable_tokens=96)
    broken = opb.PlanTurnResponse(decision=opb.PLAN_DECISION_PULL, kv_transfer_params_json="[]", reusable_tokens=9)
    assert [plans.reused_tokens(r) for r in (pull, on_decode, recompute, broken)] == [96, 64, 0, 0]


def test_plan_request_sends_ids_or_a_chain() -> None:
    ids = plans.plan_request("t", "c", "m", list(range(40)), request_id="r", salt="", turn_started=True)
    assert list(ids.prompt_token_ids) == list(range(40)) and not ids.HasField("prompt_chain")
    assert (ids.num_prompt_tokens, ids.turn_started) == (40, True)
    chain = plans.plan_request("t", "c", "m", list(range(40)), request_id="r", salt="", chain_block_size=16)
    assert chain.prompt_chain.num_tokens == 40 and not chain.prompt_token_ids
    # Without a conversation the router matches the prompt itself: always its ids.
    no_id = plans.plan_request("t", "", "m", list(range(40)), request_id="r", salt="", chain_block_size=16)
    assert len(no_id.prompt_token_ids) == 40 and not no_id.HasField("prompt_chain")


def test_report_request_sets_only_what_was_measured_within_the_routers_limit() -> None:
    bare = plans.report_request("t", "p", opb.HANDLE_USE_READ)
    assert not any(bare.HasField(f) for f in ("delivered_cached_tokens", "prefill_seconds", "copy_seconds",
                                              "inter_token_seconds", "decode_first_token_seconds"))
    long = plans.report_request("t", "p", opb.HANDLE_USE_READ, delivered_cached_tokens=0, prefill_seconds=900.0,
                                copy_seconds=1000.0, inter_token_seconds=0.02, decode_first_token_seconds=700.0)
    assert long.HasField("delivered_cached_tokens") and long.delivered_cached_tokens == 0
    assert (long.prefill_seconds, long.copy_seconds) == (plans.MAX_REPORTED_SECONDS,) * 2
    assert long.decode_first_token_seconds == plans.MAX_REPORTED_SECONDS
    assert abs(long.inter_token_seconds - 0.02) < 1e-6
