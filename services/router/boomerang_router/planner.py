"""The router's conductor: plan a turn (one claim round trip) and settle its outcome.

`Router.plan_turn` is on the time-to-first-token path. Its steps, each in the module of its
concern: pick the engines from the in-memory pool (`engine_choice`), claim the
conversation's retained blocks with a short deadline (`reuse_claim`), decide
(`engine_choice.decide_plan`, over `domain.decide`), give back a claim it will not hand out
(`claims`), and record the plan (`ledger`; its `turn_plans` row is written by a background
writer, in a group commit the answer waits for). The decision reads the engines' learned costs (`learning.CostModels`); reports
update them, never a plan. The servicer answers with it. Anything slow or failing in the control plane turns
into a COLD plan with reason CONTROL_PLANE_DEGRADED, never a failed turn.

`Router.report_turn` settles a turn: find its plan, check the report against it, end the
turn at the registry (`reports`: one CompleteTurn), and record the outcome (`ledger`, which
also learns from the times the report measured).

Claims the router will not hand out are given back in the background: when it decides
against pulling after a successful claim, when the caller went away before the answer, and
when the claim call timed out but may still have gone through (`claims.ClaimKeeper`'s
orphan probe) and no recorded plan holds it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

from boomerang_router.engine_choice import decide_plan, pick_engines
from boomerang_router.ledger import PlanLedger, check_report, new_record, plan_ids
from boomerang_router.plan_store import PlanRecord
from boomerang_router.reports import Reporter, ReportResult
from boomerang_router.requests import PlanInput, ReportInput
from boomerang_router.reuse_claim import ReuseClaimer, answer_by


class Router:
    """Plans turns and settles their outcomes; `server.build_router` puts the steps together."""

    def __init__(self, ledger: PlanLedger, claimer: ReuseClaimer, reporter: Reporter, name: str = ""):
        self.ledger = ledger
        self.models = ledger.models
        self.claimer = claimer
        self.claims = claimer.keeper
        self.reporter = reporter
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.settings, self.pool, self.audit, self.repo = ledger.settings, ledger.pool, ledger.audit, ledger.repo
        self.stats = ledger.stats
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
        replayed = self.ledger.replayed(p)
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
        engines = pick_engines(self.pool, p, self.stats)
        ids = plan_ids(p)
        claim = await self.claimer.claim_for_plan(p, engines, ids[1], by)
        d, engines = decide_plan(self.pool, self.models, p, engines, claim)
        if d.release_claim and claim.lease is not None:
            self.claims.give_back(p.tenant, claim.lease.lease_id, claim.lease.claim_id, f"ROUTER_{d.reason.value}")
        record = new_record(p, engines, claim, d, ids, self.name)
        self.ledger.record_plan(record, time.perf_counter() - start)
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
        if self.ledger.record_abandoned(record):
            self.claims.give_back(record.tenant, record.lease_id, record.claim_id, "ROUTER_CALLER_GONE")

    # -- ReportTurn, GetTurnPlan ---------------------------------------------------------

    async def report_turn(self, r: ReportInput) -> ReportResult:
        """Settle a planned turn; repeating a report repeats nothing but the answer."""
        async with self._one_report_at_a_time(r.plan_id):
            record = await self.ledger.find_plan(r.tenant, r.plan_id, r.created_at)
            pulled = check_report(record, r)
            ended = await self.reporter.end_turn_in_registry(record, r, pulled)
            result = self.ledger.record_report(record, r, pulled, ended)
            await self._audited(record)
            return result

    async def find_plan(self, tenant: str, plan_id: str, created_at: datetime) -> PlanRecord:
        """A tenant's plan from memory or `turn_plans`, or NOT_FOUND."""
        return await self.ledger.find_plan(tenant, plan_id, created_at)

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


def _forget(inflight: dict[Any, Any], key: Any, task: asyncio.Future[Any]) -> None:
    """A retry-shared plan task finished: drop it from `inflight` and mark its exception seen."""
    inflight.pop(key, None)
    if task.done() and not task.cancelled():
        task.exception()
