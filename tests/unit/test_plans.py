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
