"""How long a turn may wait for Boomerang: no longer than its reuse could save.

One rule for both callers that wait on the control plane: the router's claim (how long a
plan's claim may queue for the registry) and the vLLM hook's plan (how long a prefill
request may be held back while its plan is in flight). A prompt of `tokens` tokens that
might be pulled instead of computed saves at most `tokens × seconds_per_token` of prefill;
waiting `share` of that keeps the expected gain positive even when the wait is spent and the
answer is "recompute". `cap` bounds the wait whatever the prompt's length.
"""

from __future__ import annotations


def worth_waiting(tokens: int, seconds_per_token: float, share: float, cap: float) -> float:
    """Seconds worth waiting for a reuse of `tokens` prompt tokens (0 when nothing can be gained)."""
    if tokens <= 0 or share <= 0 or seconds_per_token <= 0:
        return 0.0
    return min(share * tokens * seconds_per_token, cap)
