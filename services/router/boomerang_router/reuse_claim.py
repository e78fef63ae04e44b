"""A plan's claim: one ClaimReuse round trip, asked within its caller's deadline.

The claim is the only registry call on the time-to-first-token path, so it never fails a
plan: a registry that is slow, down, or behind an open circuit breaker answers UNAVAILABLE
here, and the plan goes on without reuse (CONTROL_PLANE_DEGRADED). A claim whose call timed
out may still have committed; it is handed to the claim keeper's orphan probe.
"""

from __future__ import annotations

import logging
import time
from collections import Counter as Tally

from boomerang.clients.base import BoomerangClientError
from boomerang.plans import worth_waiting
from boomerang.resilience import TRANSIENT_CODES, CircuitBreaker
from boomerang.tokenchain import build_chain
from boomerang_server.leases import ClaimOutcome
from prometheus_client import Counter

from boomerang_router import metrics
from boomerang_router.claim_keeper import QUEUE_FULL, QUEUE_TIMEOUT, ClaimBatcher, ClaimKeeper
from boomerang_router.domain import ClaimResult, claim_floor
from boomerang_router.engine_choice import EngineChoice
from boomerang_router.registry_api import RouterRegistry, claim_request
from boomerang_router.requests import PlanInput
from boomerang_router.settings import RouterSettings

log = logging.getLogger(__name__)

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

    def __init__(self, settings: RouterSettings, api: RouterRegistry, keeper: ClaimKeeper, stats: Tally[str]):
        self.settings = settings
        self.keeper = keeper
        self.stats = stats
        self.claim_deadline = settings.claim_deadline_ms / 1000
        self.seconds_per_token = metrics.prefill_seconds_per_token()  # for claim_wait
        self.breaker = CircuitBreaker(settings.breaker_failures, settings.breaker_cooldown_seconds)
        self._counted: BoomerangClientError | None = None  # the last failed call the breaker counted
        self.batcher = ClaimBatcher(api, settings.claim_batch_max, settings.claim_batches_in_flight, settings.claim_queue_max)

    def claim_wait(self, prompt_tokens: int) -> float:
        """Seconds a plan's claim may wait, before its caller's deadline (`claim_wait`)."""
        return claim_wait(self.claim_deadline, self.settings.claim_wait_share, prompt_tokens, self.seconds_per_token)

    async def claim_for_plan(
        self, p: PlanInput, engines: EngineChoice, claim_id: str, answer_by: float | None = None
    ) -> ClaimResult:
        """The plan's claim, or why there is none (UNAVAILABLE, with a detail, when unanswered)."""
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
        block_size = engines.block_size
        chain = p.chain if p.chain is not None else build_chain(p.token_ids or [], block_size, p.salt)
        req = claim_request(
            p.tenant,
            p.conversation_id,
            chain,
            # A started turn's plan claims nothing, yet learns what a claim would have found.
            p.prompt_tokens + 1 if p.turn_started else claim_floor(p.prompt_tokens, block_size, engines.threshold),
            self.settings.min_remaining_seconds,
            claim_id,
            p.model,
            p.token_ids if not p.conversation_id else None,
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
