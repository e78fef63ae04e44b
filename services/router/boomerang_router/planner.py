"""The router's conductor: plan a turn (one claim round trip) and settle its outcome.

`Router.plan_turn` is on the time-to-first-token path. Its steps, each in the module of its
concern: pick the engines from the in-memory pool (`engines`), claim the conversation's
retained blocks with a short deadline (`claims`), decide (`engines.decide_plan`, over
`domain.decide`), give back a claim it will not hand out (`settlement.ClaimKeeper`), and
record the plan (below: counted in its engines' load while its turn runs, kept in memory
for retries and reports, and queued for `turn_plans`, written by a background writer in a
group commit the answer waits for). The decision reads the engines' learned costs
(`learning.CostModels`); reports update them, never a plan. `rpc_surface` answers with it.
Anything slow or failing in the control plane turns into a COLD plan with reason
CONTROL_PLANE_DEGRADED, never a failed turn.

A retried PlanTurn (same `request_id`) is answered with the plan it already got, except a
degraded one: asking again may find the claim that committed after the deadline (the same
claim id returns it) and use it.

`Router.report_turn` settles a turn: find its plan, check the report against it, end the
turn at the registry (`settlement`: one CompleteTurn), and record the outcome (which also
teaches the cost models the times the report measured).

Claims the router will not hand out are given back in the background: when it decides
against pulling after a successful claim, when the caller went away before the answer, and
when the claim call timed out but may still have gone through (`settlement.ClaimKeeper`'s
orphan probe) and no recorded plan holds it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from boomerang.errors import FieldViolation, failed_precondition, invalid, not_found

from boomerang_router.claims import ReuseClaimer, answer_by
from boomerang_router.domain import (
    ClaimResult,
    Decision,
    HandleUse,
    PlanDecision,
    PlanInput,
    PlanReason,
    ReportInput,
    first_turn_params,
    pull_params,
    turn_outcome,
)
from boomerang_router.engines import EngineChoice, EnginePool, decide_plan, pick_engines
from boomerang_router.learning import CostModels, Observation
from boomerang_router.plan_store import (
    PLAN_SECONDS,
    PLANS,
    PlanRecord,
    PlanStore,
    claim_id_for,
    new_plan_id,
    observe_delivered,
    observe_plan,
    observe_report,
    plan_time,
)
from boomerang_router.repository import AuditWriter, TurnPlanRepository
from boomerang_router.settings import RouterSettings
from boomerang_router.settlement import Reporter, ReportResult, TurnEnding


class Router:
    """Plans turns and settles their outcomes; `server.build_router` puts the steps together."""

    def __init__(
        self,
        settings: RouterSettings,
        pool: EnginePool,
        audit: AuditWriter,
        repo: TurnPlanRepository,
        store: PlanStore,
        models: CostModels,
        claimer: ReuseClaimer,
        reporter: Reporter,
        stats: Counter[str],
        name: str = "",
    ):
        self.settings = settings
        self.pool = pool
        self.audit = audit  # queues `turn_plans` rows
        self.repo = repo  # reads back the plans that left `store`
        self.store = store  # recent plans, for retries and reports
        self.models = models  # the engines' learned costs: plans read them, reports update them
        self.claimer = claimer
        self.claims = claimer.keeper
        self.reporter = reporter
        self.stats = stats
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self._inflight: dict[tuple[str, str], asyncio.Task[PlanRecord]] = {}
        self._report_locks: dict[str, list[Any]] = {}  # plan id → [lock, users]

    # -- PlanTurn ------------------------------------------------------------------------

    async def plan_turn(self, p: PlanInput, caller_seconds: float | None = None) -> PlanRecord:
        """Plan one turn; retries with the same request id get the same plan.

        `caller_seconds` is what is left of the caller's deadline: the claim waits at most
        that less a reply margin (and never past the claim deadline), so the plan answers —
        degraded, if the registry or its database is slow — before the caller gives up.
        """
        by = answer_by(caller_seconds)
        replayed = self.replayed(p)
        if replayed is not None:
            return replayed
        if p.request_id:  # a retry while the first is still planning shares its plan
            key = (p.tenant, p.request_id)
            task = self._inflight.get(key)
            if task is None:
                task = asyncio.ensure_future(self._plan_steps(p, by))
                self._inflight[key] = task
                task.add_done_callback(lambda t: _forget(self._inflight, key, t))
            return await asyncio.shield(task)
        task = asyncio.ensure_future(self._plan_steps(p, by))
        try:
            # Shielded: a caller that gives up must not cut a claim off half-recorded.
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._abandoned)
            raise

    async def _plan_steps(self, p: PlanInput, by: float | None) -> PlanRecord:
        """Pick engines → claim → decide → give back what is not handed out → record."""
        start = time.perf_counter()
        engines = pick_engines(self.pool, p)
        ids = plan_ids(p)
        claim = await self.claimer.claim_for_plan(p, engines, ids[1], by)
        d, engines = decide_plan(self.pool, self.models, p, engines, claim)
        if d.release_claim and claim.lease is not None:
            self.claims.give_back(p.tenant, claim.lease.lease_id, claim.lease.claim_id, f"ROUTER_{d.reason.value}")
        record = new_record(p, engines, claim, d, ids, self.name)
        self.record_plan(record, time.perf_counter() - start)
        left = None if by is None else by - time.monotonic()
        await self._audited(record, left)
        return record

    async def _audited(self, record: PlanRecord, left: float | None = None) -> None:
        """Wait until the plan's `turn_plans` row is written, or past the wait (or the caller's
        deadline) spooled: an answer sent before either would leave a served turn without its
        audit row if this router died next."""
        wait = self.settings.audit_wait_ms / 1000
        if left is not None:
            wait = min(wait, max(left, 0.0))
        if self.settings.audit_wait_ms > 0:
            await self.audit.kept(record.plan_id, wait)

    def _abandoned(self, task: asyncio.Task[PlanRecord]) -> None:
        """The caller went away before the answer: nobody got this handle, give it back."""
        if task.cancelled() or task.exception() is not None:
            return
        record = task.result()
        if self.record_abandoned(record):
            self.claims.give_back(record.tenant, record.lease_id, record.claim_id, "ROUTER_CALLER_GONE")

    # -- ReportTurn, GetTurnPlan ---------------------------------------------------------

    async def report_turn(self, r: ReportInput) -> ReportResult:
        """Settle a planned turn; repeating a report repeats nothing but the answer."""
        async with self._one_report_at_a_time(r.plan_id):
            record = await self.find_plan(r.tenant, r.plan_id, r.created_at)
            pulled = check_report(record, r)
            ended = await self.reporter.end_turn(record, r, pulled)
            result = self.record_report(record, r, pulled, ended)
            await self._audited(record)
            return result

    @asynccontextmanager
    async def _one_report_at_a_time(self, plan_id: str) -> AsyncIterator[None]:
        """Reports of one plan run one after another (a repeat then sees the first's outcome)."""
        slot = self._report_locks.setdefault(plan_id, [asyncio.Lock(), 0])
        slot[1] += 1
        try:
            async with slot[0]:
                yield
        finally:
            slot[1] -= 1
            if slot[1] == 0:
                self._report_locks.pop(plan_id, None)

    # -- lifecycle -----------------------------------------------------------------------

    async def drain(self, timeout: float = 5.0) -> None:
        """Wait (bounded) for background claim releases."""
        await self.claims.drain(timeout)

    # -- the plans: kept, counted in their engines' load, recorded ----------------------------

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
        return done

    def record_plan(self, record: PlanRecord, elapsed: float) -> None:
        """Count a new plan in its engines' load, keep it, queue its row, and observe it."""
        record.plan_micros = int(elapsed * 1e6)
        self._count(record)
        for old in self.store.put(record):
            self._uncount(old)
        self.audit.submit(record)
        PLANS.labels(record.decision.value, record.reason.value).inc()
        PLAN_SECONDS.observe(elapsed)
        observe_plan(record)

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
            record = await self.repo.get(tenant, plan_id, created_at)
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
                observe_delivered(record, r.delivered_cached_tokens)
            record.delivered_cached_tokens = r.delivered_cached_tokens
        record.params = None  # a reported turn's handle is never handed out again; free its block ids
        self._uncount(record)
        self.audit.submit(record)
        observe_report(record)
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


def _forget(inflight: dict[Any, Any], key: Any, task: asyncio.Future[Any]) -> None:
    """A retry-shared plan task finished: drop it from `inflight` and mark its exception seen."""
    inflight.pop(key, None)
    if task.done() and not task.cancelled():
        task.exception()


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
        source_engine_id=lease.engine_id if lease else "",
        lease_id=lease.lease_id if lease else "",
        claim_id=claim_id if lease else "",
        router=router,
        outcome_detail=claim.detail,
        params=pull_params(lease, d.reusable_tokens) if lease else first_turn_params(),
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
