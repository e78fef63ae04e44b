"""A plan's claim: one ClaimReuse round trip within its caller's deadline, through a batcher.

The claim is the only registry call on the time-to-first-token path, so it never fails a
plan: a registry that is slow, down, or behind an open circuit breaker answers UNAVAILABLE
here, and the plan goes on without reuse (CONTROL_PLANE_DEGRADED). A claim whose call timed
out may still have committed; it is handed to the claim keeper's orphan probe
(`settlement.ClaimKeeper`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

from boomerang import chainproto
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient
from boomerang.errors import BoomerangError, Code
from boomerang.grpcutil import from_code_number
from boomerang.plans import worth_waiting
from boomerang.resilience import TRANSIENT_CODES, CircuitBreaker
from boomerang.tokenchain import build_chain
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb
from boomerang_server.leases import ClaimOutcome
from boomerang_server.rpc.server import LATENCY_BUCKETS
from prometheus_client import Counter as Counted
from prometheus_client import Gauge, Histogram

from boomerang_router.domain import ClaimResult, LeaseHandle, PlanInput, claim_floor
from boomerang_router.engines import EngineChoice
from boomerang_router.plan_store import prefill_seconds_per_token
from boomerang_router.settings import RouterSettings
from boomerang_router.settlement import ClaimKeeper

log = logging.getLogger(__name__)

CLAIMS_UNANSWERED = Counted(
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


def answer_by(caller_seconds: float | None) -> float | None:
    """The monotonic time by which a plan stops waiting for its claim (None: no caller deadline)."""
    return None if caller_seconds is None else time.monotonic() + reply_budget(caller_seconds)


def claim_wait(deadline: float, share: float, prompt_tokens: int, seconds_per_token: float) -> float:
    """Seconds a claim may wait for the registry.

    Under load a claim queues rather than give up, for as long as the reuse it may bring is
    worth (`boomerang.plans`, the rule the vLLM hook's plan wait follows too): at least the
    claim deadline, and for a long prompt `share` of the prefill time it could save, up to
    MAX_SHARE_WAIT_SECONDS (recomputing 20k tokens costs far more GPU time than a claim that
    waits a hundred milliseconds).
    """
    return max(deadline, worth_waiting(prompt_tokens, seconds_per_token, share, MAX_SHARE_WAIT_SECONDS))


class ReuseClaimer:
    """Asks the registry for each plan's claim, through the claim batcher and a circuit breaker."""

    def __init__(
        self,
        settings: RouterSettings,
        registry: RegistryClient,
        keeper: ClaimKeeper,
        stats: Counter[str],
    ):
        self.settings = settings
        self.keeper = keeper
        self.stats = stats
        self.claim_deadline = settings.claim_deadline_ms / 1000
        self.seconds_per_token = prefill_seconds_per_token()  # for claim_wait
        self.breaker = CircuitBreaker(settings.breaker_failures, settings.breaker_cooldown_seconds)
        self._counted: BoomerangClientError | None = None  # the last failed call the breaker counted
        self.batcher = ClaimBatcher(
            registry, settings.claim_batch_max, settings.claim_batches_in_flight, settings.claim_queue_max
        )

    async def claim_for_plan(
        self, p: PlanInput, engines: EngineChoice, claim_id: str, answer_by: float | None = None
    ) -> ClaimResult:
        """The plan's claim, or why there is none (UNAVAILABLE, with a detail, when unanswered)."""
        if not p.conversation_id and p.token_ids is None:
            return ClaimResult(ClaimOutcome.NOT_ASKED)  # found by the prompt only: that needs its tokens
        share = self.settings.claim_wait_share
        allowed = claim_wait(self.claim_deadline, share, p.prompt_tokens, self.seconds_per_token)
        wait = allowed if answer_by is None else min(allowed, answer_by - time.monotonic())
        if wait <= MIN_CLAIM_SECONDS:
            self._unanswered("claims_skipped_caller_deadline", "caller_deadline")
            return ClaimResult(ClaimOutcome.UNAVAILABLE, detail="no time left in the caller's deadline for a claim")
        if not self.breaker.allow():
            self._unanswered("claims_skipped_breaker_open", "breaker_open")
            return ClaimResult(ClaimOutcome.UNAVAILABLE, detail="registry circuit open")
        block_size = engines.block_size
        chain = p.chain if p.chain is not None else build_chain(p.token_ids or [], block_size, p.salt)
        req = rpb.ClaimReuseRequest(
            tenant=p.tenant,
            conversation_id=p.conversation_id,
            prompt_chain=chainproto.to_proto(chain),
            # A started turn's plan claims nothing, yet learns what a claim would have found.
            min_reusable_tokens=p.prompt_tokens + 1
            if p.turn_started
            else claim_floor(p.prompt_tokens, block_size, engines.threshold),
            min_remaining_seconds=self.settings.min_remaining_seconds,
            claim_id=claim_id,
            model=p.model,
            # Without a conversation id the lease is found by the prompt's tokens.
            prompt_token_ids=p.token_ids if not p.conversation_id and p.token_ids else (),
        )
        try:
            claim = await self.batcher.claim_in_batch(req, wait, patient=wait > self.claim_deadline)
        except BoomerangClientError as err:
            self._failed(err, wait)
            if err.code in ("DEADLINE_EXCEEDED", "UNAVAILABLE", "UNKNOWN"):
                self.keeper.probe_orphan(req)
            return ClaimResult(ClaimOutcome.UNAVAILABLE, detail=f"ClaimReuse {err.code} {err.reason}")
        self.breaker.record_success()
        return claim

    def _failed(self, err: BoomerangClientError, wait: float) -> None:
        """Count a failed claim call, and let the breaker count the registry's own failures."""
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
        log.log(logging.INFO if transient else logging.ERROR, "claim failed, planning without reuse: %s", err)

    def _unanswered(self, stat: str, why: str) -> None:
        """Count a plan made without the claim's answer, in the stats and the metric."""
        self.stats[stat] += 1
        CLAIMS_UNANSWERED.labels(why).inc()


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
    req: rpb.ClaimReuseRequest
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
    call would be (the claim keeper's orphan probe finds a claim that committed). A full queue
    answers CLAIM_QUEUE_FULL at once. Depth, wait, batch sizes and sheds are metrics.
    """

    def __init__(self, registry: RegistryClient, max_batch: int, in_flight: int, queue_max: int):
        self.registry = registry
        self.max_batch = max_batch
        self.in_flight = in_flight
        self.queue_max = queue_max
        self.queue: deque[_Waiting] = deque()
        self.sending = 0
        self.tasks: set[asyncio.Task[None]] = set()

    async def claim_in_batch(
        self, req: rpb.ClaimReuseRequest, timeout: float, patient: bool = False
    ) -> ClaimResult:
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
                answer = await self.registry.claim_reuse(batch[0].req, timeout=timeout)
                results = [claim_result(answer)]  # CLAIMED without its lease: UNAVAILABLE
            else:
                reqs = [item.req for item in batch]
                results = await claim_reuse_batch(self.registry, reqs, timeout)
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


# The registry's outcomes, each under its own name (an unknown one reads as UNAVAILABLE).
_CLAIM_STATUS = {v: ClaimOutcome(n.removeprefix("CLAIM_OUTCOME_")) for n, v in rpb.ClaimOutcome.items() if v}


def claim_result(resp: rpb.ClaimReuseResponse) -> ClaimResult:
    """A ClaimReuse answer as the planner needs it; CLAIMED without its lease is UNAVAILABLE."""
    status = _CLAIM_STATUS.get(resp.outcome, ClaimOutcome.UNAVAILABLE)
    lease = lease_handle(resp.lease) if status is ClaimOutcome.CLAIMED and resp.HasField("lease") else None
    if status is ClaimOutcome.CLAIMED and lease is None:
        status = ClaimOutcome.UNAVAILABLE
    detail = ""
    if status is ClaimOutcome.LEASE_RELEASED and resp.HasField("lease"):
        detail = f"lease {resp.lease.lease_id} on {resp.lease.engine_id} was released early"
    return ClaimResult(status, lease, int(resp.reusable_tokens), float(resp.remaining_seconds), detail)


def lease_handle(lease: tpb.Lease) -> LeaseHandle:
    """The claimed lease as the plan decision needs it."""
    return LeaseHandle(
        lease_id=lease.lease_id,
        claim_id=lease.claim_id,
        engine_id=lease.engine_id,
        engine_generation=lease.engine_generation,
        remote_request_id=lease.remote_request_id,
        block_groups=tuple(tuple(g.block_ids) for g in lease.block_groups),
        num_tokens=lease.num_tokens,
        block_size=lease.block_size,
        remote_host=lease.remote_host,
        remote_port=lease.remote_port,
        tp_size=lease.tp_size or 1,
        dcp_size=lease.dcp_size or 1,
        pp_size=lease.pp_size or 1,
    )


async def claim_reuse_batch(
    registry: RegistryClient, reqs: Sequence[rpb.ClaimReuseRequest], timeout: float
) -> list[ClaimResult | BoomerangClientError]:
    """ClaimReuseBatch: each claim's result, or the error that claim alone failed with."""
    batch = rpb.ClaimReuseBatchRequest(claims=reqs)
    resp = await registry.claim_reuse_batch(batch, timeout=timeout)
    if len(resp.results) != len(reqs):
        mismatch = f"{len(resp.results)} results for {len(reqs)} claims"
        raise BoomerangClientError(
            "ClaimReuseBatch", BoomerangError(Code.INTERNAL, "BATCH_MISMATCH", mismatch)
        )
    out: list[ClaimResult | BoomerangClientError] = []
    for r in resp.results:
        if r.error_code:
            error = from_code_number(r.error_code, r.error_reason, r.error_message)
            out.append(BoomerangClientError("ClaimReuse", error))
        else:
            out.append(claim_result(r.response))
    return out
