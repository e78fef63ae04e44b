"""The gateway's `boomerang.*` trace attributes: what a turn was planned to do, and why.

Set on the HTTP server span of each turn (a no-op when tracing is off), so a trace viewer
shows a turn's decision, reason and tokens without opening the router's spans.
"""

from __future__ import annotations

from boomerang.telemetry import annotate

from boomerang_gateway.turn import Turn


def annotate_turn(turn: Turn) -> None:
    """Put the turn's plan on the current (HTTP server) span."""
    plan = turn.plan
    prompt = len(turn.prompt_token_ids) if turn.prompt_token_ids is not None else None
    annotate(
        tenant=turn.tenant,
        conversation=turn.req.conversation_id or None,
        decision=plan.decision,
        reason=plan.reason,
        plan_id=plan.plan_id or None,
        prompt_tokens=prompt,
        reused_tokens=plan.reused_tokens,
        recomputed_tokens=None if prompt is None else prompt - plan.reused_tokens,
        request_id=turn.request_id,
    )
