"""A plan as its callers use it: how long it is worth waiting for, and reading the router's
PlanTurn answer (its decision, its reason, and a PULL's `kv_transfer_params`).

How long a turn may wait for Boomerang: no longer than its reuse could save. One rule for
both callers that wait on the control plane: the router's claim (how long a plan's claim may
queue for the registry) and the vLLM hook's plan (how long a prefill request may be held
back while its plan is in flight). A prompt of `tokens` tokens that might be pulled instead
of computed saves at most `tokens × seconds_per_token` of prefill; waiting `share` of that
keeps the expected gain positive even when the wait is spent and the answer is "recompute".
`cap` bounds the wait whatever the prompt's length.

Both callers of PlanTurn read the answer through here: the gateway (`boomerang_gateway.control`)
and the vLLM hook's planner (`boomerang_vllm_hook.planner`). A decision this build does not
know, or a PULL whose parameters are not a JSON object, is unusable: the caller then computes
the turn as it would without a plan.
"""

from __future__ import annotations

import json
from typing import Any

from boomerang.v1 import router_service_pb2 as opb

# The decisions a caller can act on; anything else (UNSPECIFIED, a newer router's) is unusable.
# PREFILL_ON_DECODE comes only to callers that asked for it (`can_prefill_on_decode`).
DECISIONS = frozenset({"PULL", "RECOMPUTE", "COLD", "PREFILL_ON_DECODE"})


def worth_waiting(tokens: int, seconds_per_token: float, share: float, cap: float) -> float:
    """Seconds worth waiting for a reuse of `tokens` prompt tokens (0 when nothing can be gained)."""
    if tokens <= 0 or share <= 0 or seconds_per_token <= 0:
        return 0.0
    return min(share * tokens * seconds_per_token, cap)


def decision_name(resp: opb.PlanTurnResponse) -> str:
    """`PULL`, `RECOMPUTE`, `COLD` or `PREFILL_ON_DECODE`; `UNSPECIFIED` or `UNKNOWN_<n>` for one not to act on."""
    try:
        return str(opb.PlanDecision.Name(resp.decision)).removeprefix("PLAN_DECISION_")
    except ValueError:  # a value this build's proto does not name
        return f"UNKNOWN_{int(resp.decision)}"


def reason_name(resp: opb.PlanTurnResponse) -> str:
    """The plan's reason without its enum prefix (`UNKNOWN_<n>` for one this build does not name)."""
    try:
        return str(opb.PlanReason.Name(resp.reason)).removeprefix("PLAN_REASON_")
    except ValueError:
        return f"UNKNOWN_{int(resp.reason)}"


def pull_params(resp: opb.PlanTurnResponse) -> dict[str, Any] | None:
    """A PULL's `kv_transfer_params` for vLLM; None for another decision or params that are not a JSON object."""
    if resp.decision != opb.PLAN_DECISION_PULL or not resp.kv_transfer_params_json:
        return None
    try:
        params = json.loads(resp.kv_transfer_params_json)
    except ValueError:
        return None
    return params if isinstance(params, dict) else None


def usable(resp: opb.PlanTurnResponse) -> bool:
    """Whether a caller can act on the answer: a known decision, and a PULL with its params."""
    decision = decision_name(resp)
    return decision in DECISIONS and (decision != "PULL" or pull_params(resp) is not None)
