"""The router's core: plan a turn (one claim round trip) and settle its outcome.

`Router.plan` is on the time-to-first-token path. It picks engines from the in-memory pool,
asks the registry for one atomic claim with a short deadline, decides, and answers; the
audit row is queued for a background writer. Anything slow or failing in the control
plane turns into a COLD plan with reason CONTROL_PLANE_DEGRADED, never a failed turn.

Claims that the router will not hand out are given back in the background: when it
decides against pulling after a successful claim, when the caller went away before the
answer, and when the claim call timed out but may still have gone through (an orphan
probe re-asks with the same claim id, which can only return that claim, never take a new
one) and no recorded plan holds it — a retry with the same `request_id`, here or on another
replica, may have been handed that very claim.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import Counter as Tally
from datetime import UTC, datetime
from typing import Any

from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient
from boomerang.errors import (
    BoomerangError,
    Code,
    FieldViolation,
    failed_precondition,
    invalid,
    not_found,
)
from boomerang.leases import ClaimOutcome
from boomerang.metrics import LATENCY_BUCKETS
from boomerang.resilience import TRANSIENT_CODES, CircuitBreaker
from boomerang.tokenchain import build_chain
from boomerang.worth import worth_waiting
from prometheus_client import Counter, Histogram

from boomerang_router import kvparams, metrics
from boomerang_router.claims import QUEUE_FULL, QUEUE_TIMEOUT, ClaimBatcher, ClaimKeeper
from boomerang_router.domain import (
    ClaimResult,
    HandleUse,
    PlanDecision,
    PlanReason,
    claim_floor,
    decide,
    turn_outcome,
)
from boomerang_router.plans import PlanRecord, PlanStore, claim_id_for, new_plan_id, plan_time
from boomerang_router.pool import EnginePool, Role
from boomerang_router.registry_api import RouterRegistry, claim_request
from boomerang_router.reports import Reporter, ReportResult
from boomerang_router.repository import AuditWriter, TurnPlanRepository
from boomerang_router.requests import PlanInput, ReportInput
from boomerang_router.settings import RouterSettings

log = logging.getLogger(__name__)

PLANS = Counter("boomerang_router_plans", "Plans made", ["decision", "reason"])
PLAN_SECONDS = Histogram(
    "boomerang_router_plan_seconds",
    "Time to plan a turn, claim included",
    buckets=LATENCY_BUCKETS,
)
CLAIMS_UNANSWERED = Counter(
    "boomerang_router_claims_unanswered",
    "Plans that went without the registry's claim answer (so CONTROL_PLANE_DEGRADED), by why: "
    "breaker_open, caller_deadline (no time left for a claim), or the failed claim's gRPC code "
    "(deadline_exceeded, unavailable, ...) or the router's own queue's claim_queue_full / claim_queue_timeout.",
    ["why"],
)


# What a plan keeps of its caller's deadline to answer in (decide, record, reply): a fifth,
# at least 20 ms, but never more than half, so a short deadline (the vLLM hook's 20 ms)
# still leaves the claim time to run.
REPLY_MARGIN_SECONDS = 0.02
MIN_CLAIM_SECONDS = 0.001
# The longest a claim waits on account of its prompt's length (claim_wait_share).
MAX_SHARE_WAIT_SECONDS = 1.0


def reply_budget(caller_seconds: float) -> float:
    """Seconds of a caller's remaining deadline a plan may spend before answering."""
    return caller_seconds - max(caller_seconds * 0.2, min(REPLY_MARGIN_SECONDS, caller_seconds * 0.5))


def claim_wait(deadline: float, share: float, prompt_tokens: int, seconds_per_token: float) -> float:
    """Seconds a claim may wait for the registry.

    Under load a claim queues rather than give up, for as long as the reuse it may bring is
    worth (`boomerang.worth`, the rule the vLLM hook's plan wait follows too): at least the
    claim deadline, and for a long prompt `share` of the prefill time it could save, up to
    MAX_SHARE_WAIT_SECONDS (recomputing 20k tokens costs far more GPU time than a claim that
    waits a hundred milliseconds).
    """
    return max(deadline, worth_waiting(prompt_tokens, seconds_per_token, share, MAX_SHARE_WAIT_SECONDS))


class Router:
    """Plans turns and settles their outcomes over the registry, the pool and the audit writer."""

    def __init__(
        self,
        settings: RouterSettings,
        registry: RegistryClient,
        pool: EnginePool,
        audit: AuditWriter,
        repo: TurnPlanRepository,
        name: str = "",
    ):
        self.settings = settings
        self.registry = registry
        self.pool = pool
        self.audit = audit
        self.repo = repo
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.claim_deadline = settings.claim_deadline_ms / 1000
        self.seconds_per_token = metrics.prefill_seconds_per_token()  # for claim_wait
        self.breaker = CircuitBreaker(settings.breaker_failures, settings.breaker_cooldown_seconds)
        self._counted: BoomerangClientError | None = None  # the last failed call the breaker counted
        self.store = PlanStore(
            settings.plan_memory_seconds, settings.plan_memory_max, max_bytes=int(settings.plan_memory_mb * 2**20)
        )
        self.stats: Tally[str] = Tally()
        self._inflight: dict[tuple[str, str], asyncio.Task[PlanRecord]] = {}
        self._report_locks: dict[str, list[Any]] = {}  # plan id → [lock, users]
        self.api = RouterRegistry(registry)
        self.claims = ClaimKeeper(settings, self.api, self.store, repo, self.stats)
        self.batcher = ClaimBatcher(
            self.api, settings.claim_batch_max, settings.claim_batches_in_flight, settings.claim_queue_max
        )
        self.reporter = Reporter(settings, self.api, pool)

    # -- PlanTurn ------------------------------------------------------------------------

    async def plan(self, p: PlanInput, caller_seconds: float | None = None) -> PlanRecord:
        """Plan one turn; retries with the same request id get the same plan.

        `caller_seconds` is what is left of the caller's deadline: the claim waits at most
        that less a reply margin (and never past the claim deadline), so the plan answers —
        degraded, if the registry or its database is slow — before the caller gives up.
        """
        answer_by = None if caller_seconds is None else time.monotonic() + reply_budget(caller_seconds)
        if p.request_id:
            key = (p.tenant, p.request_id)
            done = self.store.by_request(*key)
            # A degraded answer is not replayed: asking again may find the claim that
            # committed after the deadline (the same claim id returns it) and use it.
            if done is not None and done.reason is not PlanReason.CONTROL_PLANE_DEGRADED:
                if done.reported_at is not None and done.decision is PlanDecision.PULL:
                    raise failed_precondition(
                        "PLAN_ALREADY_REPORTED",
                        f"request {p.request_id!r} was planned as {done.plan_id} and that turn is reported",
                    )
                self.stats["plans_replayed"] += 1
                return done
            task = self._inflight.get(key)
            if task is None:
                task = asyncio.ensure_future(self._plan(p, answer_by))
                self._inflight[key] = task
                task.add_done_callback(lambda t: _forget(self._inflight, key, t))
            return await asyncio.shield(task)
        task = asyncio.ensure_future(self._plan(p, answer_by))
        try:
            # Shielded: a caller that gives up must not cut a claim off half-recorded.
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._abandoned)
            raise

    async def _plan(self, p: PlanInput, answer_by: float | None = None) -> PlanRecord:
        start = time.perf_counter()
        prefill = self.pool.choose(p.model, Role.PREFILL)
        decode = self.pool.choose(p.model, Role.DECODE)
        if prefill is None or decode is None:
            role = "PREFILL" if prefill is None else "DECODE"
            self.stats[f"no_{role.lower()}_engine"] += 1
            raise BoomerangError(
                Code.UNAVAILABLE,
                f"NO_{role}_ENGINE",
                f"no available {role.lower()} engine serves model {p.model!r}; see ListEngines",
            )
        threshold = self.pool.threshold(prefill)
        block_size = p.chain.block_size if p.chain is not None else self.pool.block_size(p.model)
        now = time.time()
        plan_id = new_plan_id(now)
        claim_id = claim_id_for(p.tenant, p.request_id, plan_id)
        claim = await self._claim(p, block_size, threshold, claim_id, answer_by)
        lease = claim.lease
        alive = lease is None or self.pool.source_alive(lease.engine_id, lease.engine_generation)
        d = decide(claim, p.prompt_tokens, block_size, threshold, alive)
        if d.release_claim and lease is not None:
            self.claims.spawn(self.claims.release(p.tenant, lease.lease_id, lease.claim_id, f"ROUTER_{d.reason.value}"))
        pulled = d.decision is PlanDecision.PULL and lease is not None
        record = PlanRecord(
            plan_id=plan_id,
            created_at=plan_time(plan_id),
            tenant=p.tenant,
            conversation_id=p.conversation_id,
            model=p.model,
            request_id=p.request_id,
            decision=d.decision,
            reason=d.reason,
            prefill_engine_id=prefill.engine_id,
            prefill_url=prefill.http_base_url,
            decode_engine_id=decode.engine_id,
            decode_url=decode.http_base_url,
            prompt_tokens=p.prompt_tokens,
            reusable_tokens=d.reusable_tokens,
            recompute_tokens=d.recompute_tokens,
            verified_tokens=d.verified_tokens,
            kv_recompute_threshold=threshold,
            block_size=block_size,
            source_engine_id=lease.engine_id if pulled and lease else "",
            lease_id=lease.lease_id if pulled and lease else "",
            claim_id=claim_id if pulled else "",
            router=self.name,
            outcome_detail=claim.detail,
            params=kvparams.pull(lease, d.reusable_tokens) if pulled and lease else kvparams.first_turn(),
        )
        elapsed = time.perf_counter() - start
        record.plan_micros = int(elapsed * 1e6)
        self._remember(record)
        PLANS.labels(d.decision.value, d.reason.value).inc()
        PLAN_SECONDS.observe(elapsed)
        metrics.observe_plan(record)
        return record

    async def _claim(
        self, p: PlanInput, block_size: int, threshold: int, claim_id: str, answer_by: float | None = None
    ) -> ClaimResult:
        if not p.conversation_id and p.token_ids is None:
            return ClaimResult(ClaimOutcome.NOT_ASKED)  # found by the prompt only: that needs its tokens
        allowed = self.claim_wait(p.prompt_tokens)
        wait = allowed if answer_by is None else min(allowed, answer_by - time.monotonic())
        if wait <= MIN_CLAIM_SECONDS:
            self._unanswered("claims_skipped_caller_deadline", "caller_deadline")
            return ClaimResult(ClaimOutcome.UNAVAILABLE, detail="no time left in the caller's deadline for a claim")
        if not self.breaker.allow():
            self._unanswered("claims_skipped_breaker_open", "breaker_open")
            return ClaimResult(ClaimOutcome.UNAVAILABLE, detail="registry circuit open")
        chain = p.chain if p.chain is not None else build_chain(p.token_ids or [], block_size, p.salt)
        req = claim_request(
            p.tenant,
            p.conversation_id,
            chain,
            claim_floor(p.prompt_tokens, block_size, threshold),
            self.settings.min_remaining_seconds,
            claim_id,
            p.model,
            p.token_ids if not p.conversation_id else None,
        )
        try:
            claim = await self.batcher.claim(req, wait, patient=wait > self.claim_deadline)
        except BoomerangClientError as err:
            transient = err.code in TRANSIENT_CODES
            shed = err.reason in (QUEUE_FULL, QUEUE_TIMEOUT)
            # A claim shed by the router's own queue says the router is busy, not that the registry failed;
            # one cut short by its caller's deadline says nothing about the registry either.
            # (A long prompt's wait past the claim deadline is its own allowance: a registry
            # slower than the claim deadline still counts.)
            cut_short = err.code == "DEADLINE_EXCEEDED" and wait < self.claim_deadline
            # The breaker counts failed registry calls, not claims: every claim of a batch that
            # failed gets that call's one error, and one slow batch of eight is not eight failures
            # in a row (under load it opened the breaker, and a second of plans lost their reuse).
            if transient and not shed and not cut_short and err is not self._counted:
                self._counted = err
                self.breaker.record_failure()
            self._unanswered(f"claims_failed_{err.code.lower()}", (err.reason if shed else err.code).lower())
            if err.code in ("DEADLINE_EXCEEDED", "UNAVAILABLE", "UNKNOWN"):
                self.claims.probe_orphan(req)
            log.log(logging.INFO if transient else logging.ERROR, "claim failed, planning without reuse: %s", err)
            return ClaimResult(ClaimOutcome.UNAVAILABLE, detail=f"ClaimReuse {err.code} {err.reason}")
        self.breaker.record_success()
        return claim

    def claim_wait(self, prompt_tokens: int) -> float:
        """Seconds a plan's claim may wait, before its caller's deadline (`claim_wait`)."""
        return claim_wait(self.claim_deadline, self.settings.claim_wait_share, prompt_tokens, self.seconds_per_token)

    def _unanswered(self, stat: str, why: str) -> None:
        """Count a plan made without the claim's answer, in the stats and the metric."""
        self.stats[stat] += 1
        CLAIMS_UNANSWERED.labels(why).inc()

    def _remember(self, record: PlanRecord) -> None:
        record.counted = True
        self.pool.add_planned(record.prefill_engine_id, 1, record.recompute_tokens)
        self.pool.add_planned(record.decode_engine_id, 1, 0)
        for old in self.store.put(record):
            self._uncount(old)
        self.audit.submit(record)

    def _uncount(self, record: PlanRecord) -> None:
        if record.counted:
            record.counted = False
            self.pool.add_planned(record.prefill_engine_id, -1, -record.recompute_tokens)
            self.pool.add_planned(record.decode_engine_id, -1, 0)

    def _abandoned(self, task: asyncio.Task[PlanRecord]) -> None:
        """The caller went away before the answer: nobody got this handle, give it back."""
        if task.cancelled() or task.exception() is not None:
            return
        record = task.result()
        if record.decision is PlanDecision.PULL and record.lease_id:
            self.stats["claims_released_caller_gone"] += 1
            record.outcome = "ABANDONED"
            record.outcome_detail = "the caller went away before the answer; claim released"
            self._uncount(record)
            self.claims.spawn(self.claims.release(record.tenant, record.lease_id, record.claim_id, "ROUTER_CALLER_GONE"))
            self.audit.submit(record)

    # -- ReportTurn ----------------------------------------------------------------------

    async def report(self, r: ReportInput) -> ReportResult:
        """Settle a planned turn; repeating a report repeats nothing but the answer."""
        slot = self._report_locks.setdefault(r.plan_id, [asyncio.Lock(), 0])
        slot[1] += 1
        try:
            async with slot[0]:
                return await self._report(r)
        finally:
            slot[1] -= 1
            if slot[1] == 0:
                self._report_locks.pop(r.plan_id, None)

    async def find(self, tenant: str, plan_id: str, created_at: datetime) -> PlanRecord:
        """A tenant's plan from memory or `turn_plans`, or NOT_FOUND."""
        record = self.store.get(plan_id)
        if record is None:
            record = await self.repo.get(tenant, plan_id, created_at, self.settings.block_size)
        if record is None or record.tenant != tenant:
            raise not_found("PLAN_NOT_FOUND", f"plan {plan_id} does not exist for this tenant (or is not yet recorded)")
        return record

    async def _report(self, r: ReportInput) -> ReportResult:
        record = await self.find(r.tenant, r.plan_id, r.created_at)
        if r.conversation_id and r.conversation_id != record.conversation_id:
            raise invalid([FieldViolation("conversation_id", "differs from the plan's conversation")])
        pulled = record.decision is PlanDecision.PULL and bool(record.lease_id)
        if pulled and record.handle_use and HandleUse(record.handle_use).consumed != r.handle_use.consumed:
            raise failed_precondition(
                "PLAN_ALREADY_REPORTED",
                f"plan {record.plan_id} was reported with handle_use {record.handle_use}; a report "
                "cannot change whether the handle was read",
            )
        lease_state, handle_detail, retention, lease, retain_detail = await self.reporter.end_turn(record, r, pulled)
        first = record.reported_at is None
        if first:
            record.reported_at = datetime.now(UTC)
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

    # -- lifecycle -----------------------------------------------------------------------

    async def drain(self, timeout: float = 5.0) -> None:
        """Wait (bounded) for background claim releases."""
        await self.claims.drain(timeout)


def _forget(inflight: dict[Any, Any], key: Any, task: asyncio.Future[Any]) -> None:
    """A retry-shared plan task finished: drop it from `inflight` and mark its exception seen."""
    inflight.pop(key, None)
    _retrieve(task)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a finished task's exception as seen (its owner already handled or logged it)."""
    if task.done() and not task.cancelled():
        task.exception()
