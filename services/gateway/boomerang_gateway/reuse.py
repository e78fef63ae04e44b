"""A turn's reuse outcome: what the plan promised, what the prefill engine delivered, and why
a turn reused less (pure functions, no I/O).

The prefill engine is the witness of what it did not compute. vLLM 0.33.0 tells it two ways:
`usage.prompt_tokens_details.cached_tokens` when it runs with
`--enable-prompt-tokens-details`, and always `remote_prefill_cached_tokens` in the
`kv_transfer_params` a prefill returns (its scheduler puts P's count there so the decode
engine can report it). Either counts every prompt token P did not compute: those pulled
from the decode engine plus any its own prefix cache served.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The turn reused less than the plan said: the prefill engine reported fewer cached tokens
# than it was told to pull (it declined the pull — an expiring handle, a failed read — or
# pulled part of it).
PREFILL_SHORTFALL = "PREFILL_SHORTFALL"


@dataclass(frozen=True)
class ReuseOutcome:
    """One served turn's reuse, in prompt tokens."""

    prompt_tokens: int  # 0 when the gateway never tokenized the prompt
    planned: int  # the plan's reusable tokens (PULL only)
    delivered: int | None  # the prefill engine's own count; None when it reported none
    declined: str  # why the turn reused less than planned, or nothing; "" when it did not

    @property
    def cached_tokens(self) -> int:
        """`usage.prompt_tokens_details.cached_tokens`: the prompt tokens not recomputed."""
        return self.delivered if self.delivered is not None else self.planned


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def delivered_by_prefill(body: Any) -> int | None:
    """The prompt tokens a prefill response says were not computed, or None if it does not say."""
    if not isinstance(body, dict):
        return None
    usage = body.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    if isinstance(details, dict) and (n := _count(details.get("cached_tokens"))) is not None:
        return n
    params = body.get("kv_transfer_params")
    if isinstance(params, dict):
        return _count(params.get("remote_prefill_cached_tokens"))
    return None


def prompt_tokens_of(body: Any) -> int:
    """The prompt length a response's `usage` gives, or 0."""
    usage = body.get("usage") if isinstance(body, dict) else None
    return (_count(usage.get("prompt_tokens")) or 0) if isinstance(usage, dict) else 0


def outcome(
    decision: str, reason: str, prompt_tokens: int, planned: int, delivered: int | None
) -> ReuseOutcome:
    """The outcome of a turn whose prefill succeeded.

    `decision` and `reason` are the plan's after the gateway's own changes (a PULL retried as
    a recompute is `RECOMPUTE`/`PREFILL_RETRY`); `planned` is the router's reusable tokens
    before them. A turn that reused nothing is declined for the plan's reason (`NO_LEASE`,
    `PREFIX_MISMATCH`, … or the gateway's `TOKENIZE_FAILED`, `CONTROL_PLANE_DEGRADED`,
    `REUSE_OFF`, `PREFILL_RETRY`); a PULL whose prefill engine reports fewer cached tokens
    than planned is a `PREFILL_SHORTFALL`. A turn the engines' vLLM hook planned (`ENGINE`:
    the gateway knows no plan) is declined only when the prefill engine reports it reused
    nothing.
    """
    if decision == "ENGINE":
        declined = (reason or "UNSPECIFIED") if delivered == 0 else ""
    elif decision not in ("PULL", "PREFILL_ON_DECODE"):  # the latter reuses D's own cache
        declined = reason or "UNSPECIFIED"
    elif delivered is not None and delivered < planned:
        declined = PREFILL_SHORTFALL
    else:
        declined = ""
    return ReuseOutcome(prompt_tokens, planned, delivered, declined)
