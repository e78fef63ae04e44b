"""The prefill side: ask the router for a plan inside vLLM's scheduler step, or compute locally.

`get_num_new_matched_tokens` runs on the scheduler thread, so every millisecond here delays
every request in the batch. The plan therefore gets one blocking PlanTurn call with a tight
deadline (`plan_deadline_ms`, default 20 ms, counted from the start of the hook, chain
building included), and any error or timeout means "compute locally": the request goes on
exactly as if Boomerang were absent. After `breaker_failures` failures in a row the breaker
opens and requests skip planning altogether for a pause (doubling from
`breaker_cooldown_seconds` up to 30 s) before one request tries again, so a router that
hangs costs the scheduler one deadline per pause, not one per request.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from boomerang import chainproto
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.sync import SyncRouterClient
from boomerang.resilience import CircuitBreaker
from boomerang.tokenchain import build_chain
from boomerang.v1 import router_service_pb2 as opb
from boomerang.vllm_hook.requestview import TurnContext

MAX_COOLDOWN = 30.0
PLAN_NAMESPACE = uuid.UUID("5e1f0c2a-9d3b-4a7e-8f61-2b4c6d8e0a1f")


def plan_breaker(failures: int, cooldown: float, clock: Callable[[], float] = time.monotonic) -> CircuitBreaker:
    """The planner's breaker: open after `failures` in a row, for a cooldown that doubles on each
    failed trial up to MAX_COOLDOWN."""
    return CircuitBreaker(failures, cooldown, growth=2.0, max_cooldown=MAX_COOLDOWN, clock=clock)


@dataclass
class PlanAttempt:
    """What one planning attempt produced: a plan, or why there is none."""

    response: opb.PlanTurnResponse | None
    error: str = ""  # a gRPC code name, `BREAKER_OPEN`, or `DEADLINE_SPENT`
    request: opb.PlanTurnRequest | None = None
    elapsed: float = 0.0


class PrefillPlanner:
    """PlanTurn with a deadline and a breaker; never raises."""

    def __init__(
        self,
        client: SyncRouterClient,
        *,
        engine_id: str,
        model: str,
        deadline: float,
        plan_with: Literal["chain", "tokens"],
        chain_block_size: int,
        breaker: CircuitBreaker,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.client = client
        self.engine_id = engine_id
        self.model = model
        self.deadline = deadline
        self.plan_with = plan_with
        self.chain_block_size = chain_block_size
        self.breaker = breaker
        self.clock = clock

    def request_id(self, vllm_request_id: str) -> str:
        """The PlanTurn idempotency key (a UUID from engine and request id, so it fits the
        router's 128-character limit): asking again returns the same plan, or the same claim."""
        return str(uuid.uuid5(PLAN_NAMESPACE, f"{self.engine_id}\x00{vllm_request_id}"))

    def build_request(self, context: TurnContext, prompt: Sequence[int], vllm_request_id: str) -> opb.PlanTurnRequest:
        """The PlanTurn request for this prompt (its chain, or its token ids)."""
        req = opb.PlanTurnRequest(
            tenant=context.tenant,
            conversation_id=context.conversation_id,
            model=self.model,
            num_prompt_tokens=len(prompt),
            request_id=self.request_id(vllm_request_id),
        )
        if self.plan_with == "tokens":
            req.prompt_token_ids.extend(prompt)
        else:
            req.prompt_chain.CopyFrom(chainproto.to_proto(build_chain(prompt, self.chain_block_size)))
        return req

    def plan(self, context: TurnContext, prompt: Sequence[int], vllm_request_id: str) -> PlanAttempt:
        """Ask for a plan within the deadline; an attempt without a response means compute locally."""
        start = self.clock()
        if not self.breaker.allow():
            return PlanAttempt(None, "BREAKER_OPEN")
        try:
            req = self.build_request(context, prompt, vllm_request_id)
        except ValueError:
            return PlanAttempt(None, "BAD_TOKENS", elapsed=self.clock() - start)
        left = self.deadline - (self.clock() - start)
        if left <= 0.0005:
            return PlanAttempt(None, "DEADLINE_SPENT", req, self.clock() - start)
        try:
            resp = self.client.plan_turn(req, timeout=left)
        except BoomerangClientError as err:
            # Refusals of the request itself (a bad tenant, say) say nothing about the router's health.
            if err.code not in ("INVALID_ARGUMENT", "NOT_FOUND", "PERMISSION_DENIED", "FAILED_PRECONDITION"):
                self.breaker.record_failure()
            return PlanAttempt(None, err.code, req, self.clock() - start)
        except Exception as exc:  # noqa: BLE001 - nothing may escape into vLLM's scheduler
            self.breaker.record_failure()
            return PlanAttempt(None, type(exc).__name__, req, self.clock() - start)
        self.breaker.record_success()
        return PlanAttempt(resp, "", req, self.clock() - start)


def decision_name(resp: opb.PlanTurnResponse) -> str:
    """`PULL`, `RECOMPUTE` or `COLD`."""
    return str(opb.PlanDecision.Name(resp.decision)).removeprefix("PLAN_DECISION_")


def reason_name(resp: opb.PlanTurnResponse) -> str:
    """The plan's reason without its enum prefix."""
    return str(opb.PlanReason.Name(resp.reason)).removeprefix("PLAN_REASON_")


def pull_params(resp: opb.PlanTurnResponse) -> dict[str, Any] | None:
    """The plan's `kv_transfer_params` for vLLM when it is a PULL, else None."""
    if resp.decision != opb.PLAN_DECISION_PULL or not resp.kv_transfer_params_json:
        return None
    params = json.loads(resp.kv_transfer_params_json)
    return params if isinstance(params, dict) else None
