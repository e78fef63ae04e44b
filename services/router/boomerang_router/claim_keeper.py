"""Claims the router holds but will not hand out, given back to the registry in the background.

A claim is given back (CompleteTurn with the claim not read) when the router decides against pulling after it
claimed, when the caller went away before the answer, and when a claim call timed out but
may still have committed. For the last, an orphan probe re-asks ClaimReuse under the same
claim id with an unreachable `min_reusable_tokens`: that can only return the earlier claim
(CLAIM_SQL's `prior`), never take a new one. It releases what it finds only while no plan
holds the claim, because a claim id derived from a caller's request id is shared by that
caller's retries, here or on another replica.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from boomerang.clients.base import BoomerangClientError
from boomerang.errors import BoomerangError, Code
from boomerang.resilience import TRANSIENT_CODES
from boomerang_server.rpc.server import LATENCY_BUCKETS
from prometheus_client import Counter as Counted
from prometheus_client import Gauge, Histogram

from boomerang_router.domain import ClaimResult
from boomerang_router.plan_store import PlanStore
from boomerang_router.registry_api import ClaimRequest, RouterRegistry, TurnClaim
from boomerang_router.repository import TurnPlanRepository
from boomerang_router.settings import RouterSettings

log = logging.getLogger(__name__)

ORPHAN_PROBE_DELAYS = (1.0, 4.0, 15.0)
MAX_ORPHAN_PROBES = 256


class ClaimKeeper:
    """Background releases and orphan probes, with bounded concurrency."""

    def __init__(
        self,
        settings: RouterSettings,
        registry: RouterRegistry,
        store: PlanStore,
        repo: TurnPlanRepository,
        stats: Counter[str],
    ):
        self.settings = settings
        self.registry = registry
        self.store = store
        self.repo = repo
        self.stats = stats
        self.tasks: set[asyncio.Task[Any]] = set()
        self._orphan_probes = 0

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run `coro` in the background; its failure is logged, never raised."""
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background claim task failed", exc_info=task.exception())

    def give_back(self, tenant: str, lease_id: str, claim_id: str, reason: str) -> None:
        """Release a claim nobody will read, in the background (`release_with_retries`)."""
        self.spawn(self.release_with_retries(tenant, lease_id, claim_id, reason))

    async def release_with_retries(
        self, tenant: str, lease_id: str, claim_id: str, reason: str, attempts: int = 3
    ) -> bool:
        """CompleteTurn with the claim not read (and nothing registered), retried while the
        registry is unreachable; whether it was released."""
        claim = TurnClaim(lease_id, claim_id, read=False, release_reason=reason)
        for attempt in range(attempts):
            try:
                end = await self.registry.complete_turn_in_registry(
                    tenant, claim, None, timeout=self.settings.report_timeout_seconds
                )
                if end.claim_error is not None:
                    raise end.claim_error
                self.stats["claims_released"] += 1
                return True
            except BoomerangClientError as err:
                if err.code not in TRANSIENT_CODES:
                    log.warning("could not release claim on lease %s: %s", lease_id, err)
                    return False
                await asyncio.sleep(0.2 * 2**attempt)
        log.warning("gave up releasing claim on lease %s; it stays claimed until it expires", lease_id)
        self.stats["claims_release_failed"] += 1
        return False

    def probe_orphan(self, claim: ClaimRequest) -> None:
        """Start an orphan probe for a claim call that failed or timed out (bounded in number)."""
        if self._orphan_probes >= MAX_ORPHAN_PROBES:
            self.stats["orphan_probes_skipped"] += 1
            return
        self.spawn(self._counted(claim))

    async def _counted(self, claim: ClaimRequest) -> None:
        self._orphan_probes += 1
        try:
            await self.orphan_probe(claim)
        finally:
            self._orphan_probes -= 1

    async def orphan_probe(self, claim: ClaimRequest) -> None:
        """A timed-out claim may still commit: find it under its id and give it back.

        Only while no plan holds it: a claim id derived from a caller's request id is shared
        by that caller's retries, and a retry (here or on another replica) may have been
        handed this very claim. Plans that hand a claim out are in this router's store or
        in `turn_plans`; when neither can be checked, the claim is left to expire.
        """
        since = datetime.now(UTC) - timedelta(hours=1)
        for delay in ORPHAN_PROBE_DELAYS:
            await asyncio.sleep(delay)
            try:
                lease_id = await self.registry.find_claim(claim, timeout=self.settings.report_timeout_seconds)
            except BoomerangClientError:
                continue
            if lease_id is None:
                continue
            if self.store.by_claim(claim.claim_id) is not None:
                self.stats["orphan_claims_in_use"] += 1
                return
            try:
                held = await self.repo.claim_handed_out(claim.tenant, claim.conversation_id, claim.claim_id, since)
            except Exception:
                log.warning("cannot check whether claim %s is in use; leaving it", claim.claim_id, exc_info=True)
                self.stats["orphan_claims_unchecked"] += 1
                return
            if held:
                self.stats["orphan_claims_in_use"] += 1
                return
            self.stats["orphan_claims_found"] += 1
            await self.release_with_retries(claim.tenant, lease_id, claim.claim_id, "ROUTER_CLAIM_TIMED_OUT")
            return

    async def drain(self, timeout: float = 5.0) -> None:
        """Wait (bounded) for background releases; orphan probes still sleeping are cancelled."""
        if not self.tasks:
            return
        _, pending = await asyncio.wait(list(self.tasks), timeout=timeout)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


CLAIM_QUEUE_DEPTH = Gauge("boomerang_router_claim_queue_depth", "Claims waiting to be sent to the registry.")
CLAIM_QUEUE_WAIT = Histogram(
    "boomerang_router_claim_queue_wait_seconds",
    "Time a claim waited in the router's queue before its call to the registry left.",
    buckets=LATENCY_BUCKETS,
)
CLAIM_BATCH = Histogram(
    "boomerang_router_claim_batch_size",
    "Claims per call to the registry (1: ClaimReuse, more: ClaimReuseBatch).",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
CLAIMS_SHED = Counted(
    "boomerang_router_claims_shed",
    "Claims answered without asking the registry, by why: the queue was full, or the claim's "
    "deadline passed while it waited.",
    ["reason"],
)
QUEUE_FULL = "CLAIM_QUEUE_FULL"
QUEUE_TIMEOUT = "CLAIM_QUEUE_TIMEOUT"


@dataclass(eq=False)
class _Waiting:
    req: ClaimRequest
    queued_at: float
    future: asyncio.Future[ClaimResult]
    timer: asyncio.TimerHandle | None = None
    sent: bool = False
    patient: bool = False


class ClaimBatcher:
    """Concurrent claims coalesced into few registry calls, queued briefly rather than dropped.

    At most `claim_batches_in_flight` calls are on the wire; claims that arrive meanwhile
    wait in a queue and leave together, up to `claim_batch_max` in one ClaimReuseBatch (the
    registry runs them as one statement). A lone claim goes as ClaimReuse. So a busy
    registry is asked less often with more in each call instead of being asked more often,
    and a claim waits only while the calls ahead of it run.

    Each claim has its caller's deadline, queue time included. A claim still queued when it
    passes is answered CLAIM_QUEUE_TIMEOUT (RESOURCE_EXHAUSTED) and never sent, so there is
    nothing to give back. A call carries the deadline of its most urgent claim, and gRPC
    enforces it: a late answer is DEADLINE_EXCEEDED for every claim in the call, as a direct
    call would be (the planner's orphan probe finds a claim that committed). A full queue
    answers CLAIM_QUEUE_FULL at once. Depth, wait, batch sizes and sheds are metrics.
    """

    def __init__(self, api: RouterRegistry, max_batch: int, in_flight: int, queue_max: int):
        self.api = api
        self.max_batch = max_batch
        self.in_flight = in_flight
        self.queue_max = queue_max
        self.queue: deque[_Waiting] = deque()
        self.sending = 0
        self.tasks: set[asyncio.Task[None]] = set()

    async def claim_in_batch(self, req: ClaimRequest, timeout: float, patient: bool = False) -> ClaimResult:
        """The claim's result within `timeout` seconds, or BoomerangClientError.

        A call carries its most urgent claim's deadline, so a `patient` claim (one allowed to
        wait longer than the claim deadline, for a long prompt) leaves only with other
        patient claims: its longer wait is not cut to a short claim's.
        """
        if len(self.queue) >= self.queue_max:
            CLAIMS_SHED.labels("queue_full").inc()
            raise _shed(QUEUE_FULL, f"{len(self.queue)} claims already wait for the registry")
        loop = asyncio.get_running_loop()
        item = _Waiting(req, loop.time(), loop.create_future(), patient=patient)
        item.timer = loop.call_later(timeout, self._expire, item, timeout)
        self.queue.append(item)
        self._pump()
        CLAIM_QUEUE_DEPTH.set(len(self.queue))
        return await item.future

    def _expire(self, item: _Waiting, timeout: float) -> None:
        # Only a claim still queued expires here; a sent one ends with its call, whose
        # deadline gRPC itself enforces (an answer that arrived in time counts even when
        # this process is too busy to read it at once).
        if item.future.done() or item.sent:
            return
        CLAIMS_SHED.labels("queue_timeout").inc()
        item.future.set_exception(_shed(QUEUE_TIMEOUT, f"still queued after {timeout:.3f} s"))

    def _pump(self) -> None:
        while self.sending < self.in_flight and self.queue:
            batch: list[_Waiting] = []
            later: list[_Waiting] = []  # queued claims of the other kind than this batch's
            while self.queue and len(batch) < self.max_batch:
                item = self.queue.popleft()
                if item.future.done():  # expired while queued
                    continue
                if batch and item.patient is not batch[0].patient:
                    later.append(item)
                else:
                    batch.append(item)
            self.queue.extendleft(reversed(later))  # first in line for the next call
            CLAIM_QUEUE_DEPTH.set(len(self.queue))
            if not batch:
                return
            self.sending += 1
            task = asyncio.ensure_future(self._send(batch))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _send(self, batch: list[_Waiting]) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        earliest = float("inf")
        for item in batch:
            item.sent = True
            CLAIM_QUEUE_WAIT.observe(now - item.queued_at)
            if item.timer is not None:
                earliest = min(earliest, item.timer.when())
                item.timer.cancel()
        CLAIM_BATCH.observe(len(batch))
        # The call's deadline is its most urgent claim's: no claim waits past its own.
        timeout = max(earliest - now, 0.001)
        try:
            results: list[ClaimResult | BoomerangClientError]
            if len(batch) == 1:
                results = [await self.api.claim_in_registry(batch[0].req, timeout)]
            else:
                results = await self.api.claim_batch_in_registry([item.req for item in batch], timeout)
        except BoomerangClientError as err:
            results = [err] * len(batch)
        except Exception as exc:  # every waiting caller gets an answer
            log.error("claim batch failed", exc_info=exc)
            results = [BoomerangClientError("ClaimReuse", BoomerangError(Code.INTERNAL, "INTERNAL", str(exc)))] * len(batch)
        finally:
            self.sending -= 1
        for item, result in zip(batch, results, strict=True):
            if item.future.done():
                continue
            if isinstance(result, BaseException):
                item.future.set_exception(result)
            else:
                item.future.set_result(result)
        self._pump()


def _shed(reason: str, message: str) -> BoomerangClientError:
    return BoomerangClientError("ClaimReuse", BoomerangError(Code.RESOURCE_EXHAUSTED, reason, message))
