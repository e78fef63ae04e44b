"""A plan's record from PlanTurn to ReportTurn: built from the plan's steps, counted in its
engines' load while its turn runs, kept in memory for retries and reports, queued for
`turn_plans` (the audit writer; the answer waits for its group commit), and settled by its report.

A retried PlanTurn (same `request_id`) is answered from here with the plan it already got,
except a degraded one: asking again may find the claim that committed after the deadline
(the same claim id returns it) and use it.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from datetime import UTC, datetime

from boomerang.errors import FieldViolation, failed_precondition, invalid, not_found
from boomerang.v1 import types_pb2 as tpb

from boomerang_router import kvparams, metrics
from boomerang_router.domain import (
    ClaimResult,
    Decision,
    HandleUse,
    PlanDecision,
    PlanReason,
    Retention,
    turn_outcome,
)
from boomerang_router.engine_choice import EngineChoice
from boomerang_router.learning import CostModels, Observation
from boomerang_router.plan_store import PlanRecord, PlanStore, claim_id_for, new_plan_id, plan_time
from boomerang_router.pool import EnginePool
from boomerang_router.reports import ReportResult
from boomerang_router.repository import AuditWriter, TurnPlanRepository
from boomerang_router.requests import PlanInput, ReportInput
from boomerang_router.settings import RouterSettings

# How the registry ended a turn (`Reporter.end_turn_in_registry`): the claimed lease's state, why settling
# it failed, the retention, the new lease, and why registering the blocks failed.
TurnEnding = tuple[str, str, Retention, tpb.Lease | None, str]


def plan_ids(p: PlanInput) -> tuple[str, str]:
    """A new plan's id (a UUIDv7 of now) and the claim id it asks the registry under."""
    plan_id = new_plan_id(time.time())
    return plan_id, claim_id_for(p.tenant, p.request_id, plan_id)


def new_record(
    p: PlanInput, engines: EngineChoice, claim: ClaimResult, d: Decision, ids: tuple[str, str], router: str
) -> PlanRecord:
    """The plan as decided: its engines, its tokens, and the handle it hands out if it pulls."""
    plan_id, claim_id = ids
    lease = claim.lease if d.decision is PlanDecision.PULL else None
    return PlanRecord(
        plan_id=plan_id,
        created_at=plan_time(plan_id),
        tenant=p.tenant,
        conversation_id=p.conversation_id,
        model=p.model,
        request_id=p.request_id,
        decision=d.decision,
        reason=d.reason,
        prefill_engine_id=engines.prefill.engine_id,
        prefill_url=engines.prefill.http_base_url,
        decode_engine_id=engines.decode.engine_id,
        decode_url=engines.decode.http_base_url,
        prompt_tokens=p.prompt_tokens,
        reusable_tokens=d.reusable_tokens,
        recompute_tokens=d.recompute_tokens,
        verified_tokens=d.verified_tokens,
        kv_recompute_threshold=engines.threshold,
        block_size=engines.block_size,
        source_engine_id=lease.engine_id if lease else "",
        lease_id=lease.lease_id if lease else "",
        claim_id=claim_id if lease else "",
        router=router,
        outcome_detail=claim.detail,
        params=kvparams.pull(lease, d.reusable_tokens) if lease else kvparams.first_turn(),
        prefill_cached=min(p.prefill_cached, p.prompt_tokens),
    )


def observation(record: PlanRecord, r: ReportInput) -> Observation:
    """What a reported turn teaches the cost models: who computed how much, what was pulled,
    and the times the caller measured."""
    on_decode = record.decision is PlanDecision.PREFILL_ON_DECODE
    pulled = record.decision is PlanDecision.PULL and bool(record.lease_id)
    if r.delivered_cached_tokens is not None:
        computed = record.prompt_tokens - r.delivered_cached_tokens
    elif pulled or on_decode:
        computed = record.recompute_tokens
    else:
        computed = record.prompt_tokens - record.prefill_cached
    prefill_ms = None if r.prefill_seconds is None else r.prefill_seconds * 1000
    first = r.decode_first_token_seconds
    # A started turn's plan chose no engine and verified nothing D was sent: whatever it found
    # says nothing of the history D held for this turn.
    held = 0 if record.reason is PlanReason.TURN_STARTED else record.verified_tokens
    if pulled and r.handle_use is not HandleUse.READ:
        prefill_ms = None  # P may not have run the turn as planned: nothing to learn from its time
    return Observation(
        prefill_engine=record.prefill_engine_id,
        decode_engine=record.decode_engine_id,
        source_engine=record.source_engine_id if pulled else "",
        on_decode=on_decode,
        prompt=record.prompt_tokens,
        computed=computed,
        pulled=max(record.reusable_tokens - record.prefill_cached, 0) if pulled else 0,
        prefill_ms=prefill_ms,
        copy_ms=None if r.copy_seconds is None else r.copy_seconds * 1000,
        inter_token_ms=None if r.inter_token_seconds is None else r.inter_token_seconds * 1000,
        # D's first token after a prefill on P, where D holds a verified history: it loads only
        # the new tokens (a first turn's whole prompt would make the step hang on the link's model).
        handoff_tokens=record.prompt_tokens - held,
        first_token_ms=first * 1000 if first is not None and held else None,
    )


def check_report(record: PlanRecord, r: ReportInput) -> bool:
    """Refuse a report that contradicts its plan; whether the plan handed out a claim."""
    if r.conversation_id and r.conversation_id != record.conversation_id:
        raise invalid([FieldViolation("conversation_id", "differs from the plan's conversation")])
    pulled = record.decision is PlanDecision.PULL and bool(record.lease_id)
    if pulled and record.handle_use and HandleUse(record.handle_use).consumed != r.handle_use.consumed:
        raise failed_precondition(
            "PLAN_ALREADY_REPORTED",
            f"plan {record.plan_id} was reported with handle_use {record.handle_use}; a report "
            "cannot change whether the handle was read",
        )
    return pulled


class PlanLedger:
    """Recent plans (in memory, then `turn_plans`) and the engine load they stand for."""

    def __init__(
        self,
        settings: RouterSettings,
        pool: EnginePool,
        audit: AuditWriter,
        repo: TurnPlanRepository,
        stats: Tally[str],
        models: CostModels,
    ):
        self.settings = settings
        self.models = models  # the engines' learned costs: plans read them, reports update them
        self.pool = pool
        self.audit = audit
        self.repo = repo
        self.stats = stats
        self.store = PlanStore(
            settings.plan_memory_seconds, settings.plan_memory_max, max_bytes=int(settings.plan_memory_mb * 2**20)
        )

    def replayed(self, p: PlanInput) -> PlanRecord | None:
        """The plan a retry of the same request already got, if it is still to be had."""
        if not p.request_id:
            return None
        done = self.store.by_request(p.tenant, p.request_id)
        if done is None or done.reason is PlanReason.CONTROL_PLANE_DEGRADED:
            return None
        if done.reported_at is not None and done.decision is PlanDecision.PULL:
            raise failed_precondition(
                "PLAN_ALREADY_REPORTED",
                f"request {p.request_id!r} was planned as {done.plan_id} and that turn is reported",
            )
        self.stats["plans_replayed"] += 1
        return done

    def record_plan(self, record: PlanRecord, elapsed: float) -> None:
        """Count a new plan in its engines' load, keep it, queue its row, and observe it."""
        record.plan_micros = int(elapsed * 1e6)
        self._count(record)
        for old in self.store.put(record):
            self._uncount(old)
        self.audit.submit(record)
        metrics.PLANS.labels(record.decision.value, record.reason.value).inc()
        metrics.PLAN_SECONDS.observe(elapsed)
        metrics.observe_plan(record)

    def record_abandoned(self, record: PlanRecord) -> bool:
        """A plan whose caller went away before the answer: whether it held a claim to give back."""
        if record.decision is not PlanDecision.PULL or not record.lease_id:
            return False
        self.stats["claims_released_caller_gone"] += 1
        record.outcome = "ABANDONED"
        record.outcome_detail = "the caller went away before the answer; claim released"
        self._uncount(record)
        self.audit.submit(record)
        return True

    async def find_plan(self, tenant: str, plan_id: str, created_at: datetime) -> PlanRecord:
        """A tenant's plan from memory or `turn_plans`, or NOT_FOUND."""
        record = self.store.get(plan_id)
        if record is None:
            record = await self.repo.get(tenant, plan_id, created_at, self.settings.block_size)
        if record is None or record.tenant != tenant:
            raise not_found("PLAN_NOT_FOUND", f"plan {plan_id} does not exist for this tenant (or is not yet recorded)")
        return record

    def record_report(self, record: PlanRecord, r: ReportInput, pulled: bool, ended: TurnEnding) -> ReportResult:
        """Write the turn's outcome on its plan, take it out of its engines' load, and queue its row."""
        lease_state, handle_detail, retention, lease, retain_detail = ended
        if record.reported_at is None:
            record.reported_at = datetime.now(UTC)
            self.models.observe(observation(record, r))  # a repeated report teaches nothing twice
        record.handle_use = r.handle_use.value if pulled else ""
        record.claimed_lease_state = lease_state
        record.retention = retention.value
        record.new_lease_id = lease.lease_id if lease is not None else ""
        record.outcome = turn_outcome(record.decision, r.handle_use, lease_state)
        record.outcome_detail = "; ".join(d for d in (handle_detail, retain_detail) if d)
        if r.delivered_cached_tokens is not None:
            if record.delivered_cached_tokens is None:  # a repeated report counts nothing twice
                metrics.observe_delivered(record, r.delivered_cached_tokens)
            record.delivered_cached_tokens = r.delivered_cached_tokens
        record.params = None  # a reported turn's handle is never handed out again; free its block ids
        self._uncount(record)
        self.audit.submit(record)
        self.stats["reports"] += 1
        metrics.observe_report(record)
        return ReportResult(record, lease_state, retention, lease, retain_detail)

    def _count(self, record: PlanRecord) -> None:
        record.counted = True
        if record.decision is not PlanDecision.PREFILL_ON_DECODE:  # then P does nothing
            self.pool.add_planned(record.prefill_engine_id, 1, record.recompute_tokens)
        self.pool.add_planned(record.decode_engine_id, 1, 0)

    def _uncount(self, record: PlanRecord) -> None:
        if record.counted:
            record.counted = False
            if record.decision is not PlanDecision.PREFILL_ON_DECODE:
                self.pool.add_planned(record.prefill_engine_id, -1, -record.recompute_tokens)
            self.pool.add_planned(record.decode_engine_id, -1, 0)
