"""Plans: the record of one turn's plan and outcome, its id, the in-memory store, its figures.

A plan id is a UUIDv7 (RFC 9562): its first 48 bits are the plan's creation time in Unix
milliseconds, so the audit row's `created_at` (the `turn_plans` partition key) can be read
back from the id alone and a lookup by id touches one partition.

The store keeps recent plans in memory so ReportTurn and retried PlanTurn calls on this
replica need no database read, and so unreported plans count towards engine load. Plans
leave it after `ttl` seconds, beyond `max_plans`, or beyond `max_bytes` of their estimated
size (a PULL plan holds its handle's block ids, so turns never reported — a caller that
goes away — once held hundreds of megabytes); older ones are read from `turn_plans`.

The figures of plans and reports are here too: plans by decision and reason and the time to
make them; and what an operator needs to see what reuse is worth: prompt tokens pulled
instead of computed, tokens computed, and an estimate of the prefill time the pulls saved
(reused tokens × `BOOMERANG_PREFILL_MS_PER_TOKEN`). Each plan and report is also put on the
current trace span as `boomerang.*` attributes.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache

from boomerang.telemetry import annotate
from boomerang_server.config import TelemetrySettings, load_settings
from boomerang_server.rpc.server import LATENCY_BUCKETS
from prometheus_client import Counter, Histogram

from boomerang_router.domain import KvParams, PlanDecision, PlanReason

# Namespace of claim ids derived from a caller's request id (stable across replicas).
CLAIM_NAMESPACE = uuid.UUID("6d0c1f4e-7a0b-4c61-9d3e-4b6f6f6d6572")


def new_plan_id(now: float | None = None) -> str:
    """A fresh UUIDv7 for a plan made at `now` (Unix seconds)."""
    ms = int((time.time() if now is None else now) * 1000)
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version 7
    value |= (rand >> 68) << 64  # 12 random bits
    value |= 0b10 << 62  # RFC 4122 variant
    value |= rand & ((1 << 62) - 1)
    return str(uuid.UUID(int=value))


def plan_time(plan_id: str) -> datetime:
    """The creation time a plan id carries; ValueError when it is not a plan id."""
    value = uuid.UUID(plan_id)
    if value.version != 7:
        raise ValueError("is not a plan id (a UUIDv7 returned by PlanTurn)")
    return datetime.fromtimestamp((value.int >> 80) / 1000, tz=UTC)


def claim_id_for(tenant: str, request_id: str, plan_id: str) -> str:
    """The registry claim id: stable per (tenant, request id) so retries reclaim the same lease."""
    if not request_id:
        return plan_id
    return str(uuid.uuid5(CLAIM_NAMESPACE, f"{tenant}\x00{request_id}"))


@dataclass
class PlanRecord:
    """One turn's plan and, once reported, its outcome (a `turn_plans` row)."""

    plan_id: str
    created_at: datetime
    tenant: str
    conversation_id: str
    model: str
    request_id: str
    decision: PlanDecision
    reason: PlanReason
    prefill_engine_id: str
    prefill_url: str
    decode_engine_id: str
    decode_url: str
    prompt_tokens: int
    reusable_tokens: int
    recompute_tokens: int
    verified_tokens: int
    kv_recompute_threshold: int
    source_engine_id: str = ""
    lease_id: str = ""
    claim_id: str = ""
    plan_micros: int = 0
    router: str = ""
    reported_at: datetime | None = None
    handle_use: str = ""
    claimed_lease_state: str = ""
    retention: str = ""
    new_lease_id: str = ""
    outcome: str = ""
    outcome_detail: str = ""
    delivered_cached_tokens: int | None = None  # the prefill engine's count, as reported
    prefill_cached: int = 0  # what the caller said P's own prefix cache held (not stored)
    # Not stored: the params handed out (kept so a retried PlanTurn gets the same answer),
    # and whether this plan is counted in this router's engine load.
    params: KvParams | None = None
    counted: bool = False


# Estimated bytes of a kept plan: the record and its strings, and each block id it holds.
PLAN_BYTES = 1500
BLOCK_ID_BYTES = 40


def plan_bytes(record: PlanRecord) -> int:
    """The estimated memory a kept plan holds (its handle's block ids dominate)."""
    groups = record.params.remote_block_ids if record.params is not None else None
    return PLAN_BYTES + BLOCK_ID_BYTES * sum(len(g) for g in groups or ())


class PlanStore:
    """Recent plans by id (and by the caller's request id), oldest evicted first."""

    def __init__(
        self, ttl: float, max_plans: int, clock: Callable[[], float] = time.monotonic, max_bytes: int = 0
    ):
        self.ttl = ttl
        self.max_plans = max_plans
        self.max_bytes = max_bytes  # 0: no byte limit
        self.bytes = 0
        self._mono = clock
        self._plans: OrderedDict[str, tuple[float, PlanRecord, int]] = OrderedDict()
        self._by_request: dict[tuple[str, str], str] = {}
        self._by_claim: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._plans)

    def put(self, record: PlanRecord) -> list[PlanRecord]:
        """Keep `record`; returns the plans evicted to make room or because they are old."""
        size = plan_bytes(record)
        previous = self._plans.get(record.plan_id)
        if previous is not None:
            self.bytes -= previous[2]
        self._plans[record.plan_id] = (self._mono(), record, size)
        self.bytes += size
        self._plans.move_to_end(record.plan_id)
        if record.request_id:
            self._by_request[(record.tenant, record.request_id)] = record.plan_id
        if record.claim_id:
            self._by_claim[record.claim_id] = record.plan_id
        return self.evict()

    def get(self, plan_id: str) -> PlanRecord | None:
        """A plan still in memory."""
        item = self._plans.get(plan_id)
        return None if item is None else item[1]

    def by_request(self, tenant: str, request_id: str) -> PlanRecord | None:
        """The plan made for a caller's request id, if still in memory."""
        plan_id = self._by_request.get((tenant, request_id))
        return None if plan_id is None else self.get(plan_id)

    def by_claim(self, claim_id: str) -> PlanRecord | None:
        """The plan in memory that handed out this claim, if any."""
        plan_id = self._by_claim.get(claim_id)
        return None if plan_id is None else self.get(plan_id)

    def evict(self) -> list[PlanRecord]:
        """Drop plans past their time or over the size limit; returns them."""
        out: list[PlanRecord] = []
        cutoff = self._mono() - self.ttl
        while self._plans:
            plan_id, (stamp, record, size) = next(iter(self._plans.items()))
            if stamp >= cutoff and len(self._plans) <= self.max_plans and (
                not self.max_bytes or self.bytes <= self.max_bytes
            ):
                break
            del self._plans[plan_id]
            self.bytes -= size
            if record.request_id and self._by_request.get((record.tenant, record.request_id)) == plan_id:
                del self._by_request[(record.tenant, record.request_id)]
            if record.claim_id and self._by_claim.get(record.claim_id) == plan_id:
                del self._by_claim[record.claim_id]
            out.append(record)
        return out


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
