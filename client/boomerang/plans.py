"""A plan as its callers use it: how long it is worth waiting for, the PlanTurn request,
reading the router's answer (its decision, its reason, and a PULL's `kv_transfer_params`),
and the ReportTurn request that closes it.

How long a turn may wait for Boomerang: no longer than its reuse could save. One rule for
both callers that wait on the control plane: the router's claim (how long a plan's claim may
queue for the registry) and the vLLM hook's plan (how long a prefill request may be held
back while its plan is in flight). A prompt of `tokens` tokens that might be pulled instead
of computed saves at most `tokens × seconds_per_token` of prefill; waiting `share` of that
keeps the expected gain positive even when the wait is spent and the answer is "recompute".
`cap` bounds the wait whatever the prompt's length.

Both callers of PlanTurn build their requests and read the answer through here: the gateway
(`boomerang_gateway.control`) and the vLLM hook's planner (`boomerang_vllm_hook.planner`). A
decision this build does not know, or a PULL whose parameters are not a JSON object, is
unusable: the caller then computes the turn as it would without a plan.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from boomerang import chainproto
from boomerang.tokenchain import build_chain
from boomerang.v1 import router_service_pb2 as opb

# The decisions a caller can act on; anything else (UNSPECIFIED, a newer router's) is unusable.
# PREFILL_ON_DECODE comes only to callers that asked for it (`can_prefill_on_decode`).
DECISIONS = frozenset({"PULL", "RECOMPUTE", "COLD", "PREFILL_ON_DECODE"})
MAX_REPORTED_SECONDS = 600.0  # ReportTurn's limit on a measured duration


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


def reused_tokens(resp: opb.PlanTurnResponse) -> int:
    """The prompt tokens a usable plan spares the prefill: a PULL's (pulled from the decode
    engine) or a PREFILL_ON_DECODE's (the decode engine's own cache); 0 for any other."""
    if not usable(resp) or decision_name(resp) not in ("PULL", "PREFILL_ON_DECODE"):
        return 0
    return int(resp.reusable_tokens)


def usable(resp: opb.PlanTurnResponse) -> bool:
    """Whether a caller can act on the answer: a known decision, and a PULL with its params."""
    decision = decision_name(resp)
    return decision in DECISIONS and (decision != "PULL" or pull_params(resp) is not None)


def plan_request(
    tenant: str, conversation_id: str, model: str, prompt: Sequence[int], *, request_id: str,
    salt: str, chain_block_size: int = 0, turn_started: bool = False,
) -> opb.PlanTurnRequest:
    """A PlanTurn request (`salt`: the request's `salt_key`, which also seeds the chain) with
    the prompt as its token ids, or with `chain_block_size` as its token chain. Without a
    conversation id the router finds the lease by the prompt, which needs its tokens.
    ValueError: ids a chain cannot hold."""
    req = opb.PlanTurnRequest(
        tenant=tenant,
        conversation_id=conversation_id,
        model=model,
        num_prompt_tokens=len(prompt),
        request_id=request_id,
        cache_salt=salt,
        turn_started=turn_started,
    )
    if chain_block_size and conversation_id:
        req.prompt_chain.CopyFrom(chainproto.to_proto(build_chain(prompt, chain_block_size, salt)))
    else:
        req.prompt_token_ids.extend(prompt)
    return req


def report_request(
    tenant: str, plan_id: str, handle_use: opb.HandleUse, *,
    delivered_cached_tokens: int | None = None,
    prefill_seconds: float | None = None, copy_seconds: float | None = None,
    inter_token_seconds: float | None = None, decode_first_token_seconds: float | None = None,
) -> opb.ReportTurnRequest:
    """A ReportTurn request's common part: what was not measured stays unset, a measured
    duration is clipped to MAX_REPORTED_SECONDS (the router refuses a longer one, and with it
    the report), and the copy is at most the prefill it is part of."""
    req = opb.ReportTurnRequest(tenant=tenant, plan_id=plan_id, handle_use=handle_use)
    if delivered_cached_tokens is not None:
        req.delivered_cached_tokens = delivered_cached_tokens
    if prefill_seconds is not None:
        req.prefill_seconds = prefill = min(prefill_seconds, MAX_REPORTED_SECONDS)
        if copy_seconds is not None:
            req.copy_seconds = min(copy_seconds, prefill)
    if inter_token_seconds is not None:
        req.inter_token_seconds = min(inter_token_seconds, MAX_REPORTED_SECONDS)
    if decode_first_token_seconds is not None:
        req.decode_first_token_seconds = min(decode_first_token_seconds, MAX_REPORTED_SECONDS)
    return req
