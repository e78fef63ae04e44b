"""The router's reuse figures: tokens pulled and computed, prefill time saved, trace attributes.

Plans by decision and reason and the time to make them; and what an operator needs to see
what reuse is worth: prompt tokens pulled instead of computed, tokens computed, and an
estimate of the prefill time the pulls saved (reused tokens ×
`BOOMERANG_PREFILL_MS_PER_TOKEN`). It also puts the plan on the current trace span as
`boomerang.*` attributes.
"""

from __future__ import annotations

from functools import lru_cache

from boomerang.telemetry import annotate
from boomerang_server.config import TelemetrySettings, load_settings
from boomerang_server.rpc.server import LATENCY_BUCKETS
from prometheus_client import Counter, Histogram

from boomerang_router.plan_store import PlanRecord

PLANS = Counter("boomerang_router_plans", "Plans made", ["decision", "reason"])
PLAN_SECONDS = Histogram(
    "boomerang_router_plan_seconds",
    "Time to plan a turn, claim included",
    buckets=LATENCY_BUCKETS,
)
REUSED_TOKENS = Counter(
    "boomerang_router_reused_prompt_tokens",
    "Prompt tokens the prefill engine was told to pull from a decode engine instead of computing.",
)
RECOMPUTED_TOKENS = Counter(
    "boomerang_router_recomputed_prompt_tokens",
    "Prompt tokens the prefill engine was told to compute, by plan decision.",
    ["decision"],
)
# The delivered reuse, as ReportTurn's callers give it (the gateway reads the prefill
# engine's own count; the vLLM hook counts it itself), beside the planned reuse of the same
# turns: the router's view of planned against delivered, for deployments with no gateway.
DELIVERED_TOKENS = Counter(
    "boomerang_router_reuse_delivered_tokens",
    "Prompt tokens the prefill engine reported it did not compute (ReportTurn's delivered_cached_tokens).",
)
DELIVERED_PLANNED_TOKENS = Counter(
    "boomerang_router_reuse_delivered_planned_tokens",
    "Reusable tokens the plans of those same reported turns planned (the denominator of delivered).",
)
SHORTFALL_TURNS = Counter(
    "boomerang_router_reuse_shortfall_turns",
    "Reported PULL turns whose prefill engine reported fewer cached tokens than the planned reuse (PREFILL_SHORTFALL).",
)
DECODE_PAUSE_SECONDS = Counter(
    "boomerang_router_decode_prefill_pause_seconds",
    "Predicted seconds the decode engines' running decodes are paused by the prefills planned on them "
    "(PREFILL_ON_DECODE): the cost such a plan puts on the other turns.",
)
PREFILL_SECONDS_SAVED = Counter(
    "boomerang_router_prefill_seconds_saved",
    "Estimated prefill compute time saved by pulls: reused tokens × BOOMERANG_PREFILL_MS_PER_TOKEN.",
)


@lru_cache(maxsize=1)
def prefill_seconds_per_token() -> float:
    """The configured prefill cost of one prompt token, in seconds."""
    return load_settings(TelemetrySettings).prefill_ms_per_token / 1000


def observe_plan(record: PlanRecord) -> None:
    """Count a new plan's tokens and saved time; annotate the PlanTurn span."""
    decision = record.decision.value
    if record.reusable_tokens:
        REUSED_TOKENS.inc(record.reusable_tokens)
        PREFILL_SECONDS_SAVED.inc(record.reusable_tokens * prefill_seconds_per_token())
    RECOMPUTED_TOKENS.labels(decision).inc(record.recompute_tokens)
    annotate(
        tenant=record.tenant,
        conversation=record.conversation_id,
        plan_id=record.plan_id,
        decision=decision,
        reason=record.reason.value,
        prompt_tokens=record.prompt_tokens,
        reused_tokens=record.reusable_tokens,
        recomputed_tokens=record.recompute_tokens,
        lease_id=record.lease_id or None,
    )


def observe_delivered(record: PlanRecord, delivered: int) -> None:
    """Count a turn's delivered reuse the first time it is reported."""
    DELIVERED_TOKENS.inc(delivered)
    DELIVERED_PLANNED_TOKENS.inc(record.reusable_tokens)
    if record.decision.value == "PULL" and delivered < record.reusable_tokens:
        SHORTFALL_TURNS.inc()


def observe_report(record: PlanRecord) -> None:
    """Annotate the ReportTurn span with the turn's outcome."""
    annotate(
        tenant=record.tenant,
        conversation=record.conversation_id,
        plan_id=record.plan_id,
        decision=record.decision.value,
        outcome=record.outcome or None,
        retention=record.retention or None,
        new_lease_id=record.new_lease_id or None,
    )
