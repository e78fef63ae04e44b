"""The prefill side's background plans: never blocking, deadline, breaker, request shape, PULL params."""

from __future__ import annotations

import json
import threading
import time

import pytest
from boomerang.plans import decision_name, pull_params, reason_name
from boomerang.resilience import CircuitBreaker
from boomerang.tokenchain import build_chain
from boomerang.v1 import router_service_pb2 as opb
from boomerang_vllm_hook.planner import PlanAttempt, PrefillPlanner, plan_breaker
from boomerang_vllm_hook.requestview import TurnContext

from tests.support.hook_fakes import FakeRouter, client_error
from tests.support.procs import wait_for

CTX = TurnContext("acme", "c-1")
PROMPT = list(range(1000, 1100))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# Tests not about the deadline give the planner thread ample time to send: with the hook's
# 20 ms, a busy machine that kept the thread off a core that long spent the wait before
# the request left (DEADLINE_SPENT, nothing sent), and the test read no plan.
AMPLE = 5.0


def planner(router: FakeRouter, deadline: float = AMPLE, plan_with: str = "chain", breaker: CircuitBreaker | None = None,
            max_in_flight: int = 4096) -> PrefillPlanner:
    made = PrefillPlanner(
        router,  # type: ignore[arg-type]
        engine_id="p-1",
        model="qwen3-32b",
        deadline=deadline,
        plan_with=plan_with,  # type: ignore[arg-type]
        chain_block_size=16,
        breaker=breaker or plan_breaker(3, 1.0),
        max_in_flight=max_in_flight,
    )
    made.start()
    return made


def plan(p: PrefillPlanner, prompt: list[int] = PROMPT, rid: str = "req-1", wait: float = 1.0) -> PlanAttempt:
    """Start a plan and wait (here, in the test) for its answer."""
    pending = p.begin(CTX, prompt, rid, wait, lambda *_: None)
    assert pending is not None
    assert wait_for(lambda: pending.take() is not None, 5)
    attempt = pending.take()
    assert attempt is not None
    return attempt


def test_breaker_opens_tries_once_per_cooldown_and_closes() -> None:
    clock = Clock()
    b = plan_breaker(2, 1.0, clock)
    b.record_failure()
    assert b.allow()
    b.record_failure()
    assert not b.allow() and b.opened == 1
    clock.now = 1.0
    assert b.allow() and not b.allow()  # one trial, the rest wait
    b.record_failure()  # the trial failed: twice as long now
    clock.now = 2.5
    assert not b.allow()
    clock.now = 3.0
    assert b.allow()
    b.record_success()
    assert b.allow() and b.allow() and b.cooldown == 1.0


def test_plan_request_carries_the_prompt_chain() -> None:
    router = FakeRouter()
    attempt = plan(planner(router))
    assert attempt.response is not None and attempt.error == ""
    req = router.plans[0]
    chain = build_chain(PROMPT, 16)
    assert (req.tenant, req.conversation_id, req.model, req.num_prompt_tokens) == ("acme", "c-1", "qwen3-32b", 100)
    assert req.prompt_chain.block_hashes == chain.block_hashes and req.prompt_chain.tail_hash == chain.tail_hash
    assert not req.prompt_token_ids
    # Stable per (engine, request) and short enough for the router's id rule.
    p = planner(router)
    assert req.request_id == p.request_id("req-1") != p.request_id("req-2") and len(req.request_id) == 36


def test_plan_with_token_ids() -> None:
    router = FakeRouter()
    plan(planner(router, plan_with="tokens"))
    assert list(router.plans[0].prompt_token_ids) == PROMPT and not router.plans[0].HasField("prompt_chain")


def test_slow_router_never_blocks_and_fails_at_the_deadline() -> None:
    # A deadline long enough that the plan surely leaves before it on a busy machine, and that
    # a `begin` which waited for the call (0.5 s at least) stands out from a deque append
    # however slow the machine: the bound is half of it, not a few milliseconds.
    router = FakeRouter()
    router.delay = 5.0
    p = planner(router, deadline=0.5)
    start = time.perf_counter()
    pending = p.begin(CTX, PROMPT, "req-1", 1.0, lambda *_: None)
    assert time.perf_counter() - start < 0.25  # a deque append, not a call
    assert pending is not None and pending.wait_until - pending.started == pytest.approx(0.5)  # the wait is capped by the deadline
    assert wait_for(lambda: pending.take() is not None, 5)
    attempt = pending.take()
    assert attempt is not None and attempt.response is None and attempt.error == "DEADLINE_EXCEEDED"
    assert attempt.request is not None  # kept so the reporter can find a claim made meanwhile
    assert router.plans[0].request_id == attempt.request.request_id


def test_an_answer_after_the_scheduler_gave_up_goes_to_on_late_once() -> None:
    # The answer waits for `answer` (on the fake's own thread): a 50 ms delay raced the
    # test's 50 ms polling, and a slow poll found the answer already in.
    answer = threading.Event()
    router = FakeRouter(lambda req: opb.PlanTurnResponse(plan_id="p-cold") if answer.wait(5) else opb.PlanTurnResponse())
    router.delay = 0.001  # answered on a thread of its own
    p = planner(router)
    late: list[PlanAttempt] = []
    pending = p.begin(CTX, PROMPT, "req-1", 1.0, lambda _, attempt: late.append(attempt))
    assert pending is not None
    assert wait_for(lambda: len(router.plans) == 1, 5)
    assert pending.abandon() is None  # gave up before the answer
    answer.set()
    assert wait_for(lambda: len(late) == 1, 5)
    assert late[0].response is not None and pending.take() is late[0]
    # An answer already in when the scheduler gives up is the scheduler's, not on_late's.
    router.delay = 0.0
    pending = p.begin(CTX, PROMPT, "req-2", 1.0, lambda _, attempt: late.append(attempt))
    assert pending is not None
    assert wait_for(lambda: pending.take() is not None, 5)
    assert pending.abandon() is not None and len(late) == 1


def test_too_many_in_flight_refuses_without_blocking() -> None:
    router = FakeRouter()
    router.delay = 0.5
    p = planner(router, deadline=1.0, max_in_flight=2)
    assert p.begin(CTX, PROMPT, "a", 1.0, lambda *_: None) is not None
    assert p.begin(CTX, PROMPT, "b", 1.0, lambda *_: None) is not None
    assert p.begin(CTX, PROMPT, "c", 1.0, lambda *_: None) is None and p.dropped_full == 1
    assert wait_for(lambda: p.in_flight == 0, 5)


def test_failures_open_the_breaker_and_bad_requests_do_not() -> None:
    router = FakeRouter()
    p = planner(router, breaker=plan_breaker(2, 60.0))
    router.errors.extend([client_error("PlanTurn", "INVALID_ARGUMENT")] * 3)
    for _ in range(3):
        assert plan(p).error == "INVALID_ARGUMENT"
    assert p.breaker.consecutive == 0 and p.allow()
    router.errors.extend([client_error("PlanTurn", "UNAVAILABLE")] * 2)
    assert plan(p).error == "UNAVAILABLE"
    assert plan(p).error == "UNAVAILABLE"
    assert not p.allow()  # open: the hook starts no plan


def test_out_of_range_tokens_do_not_raise() -> None:
    assert plan(planner(FakeRouter()), [2**32]).error == "BAD_TOKENS"


def test_pull_params_only_for_pull() -> None:
    params = {"do_remote_decode": True, "remote_block_ids": [[1, 2]], "remote_num_tokens": 32}
    pull = opb.PlanTurnResponse(decision=opb.PLAN_DECISION_PULL, reason=opb.PLAN_REASON_VERIFIED_PREFIX,
                                kv_transfer_params_json=json.dumps(params))
    assert pull_params(pull) == params and decision_name(pull) == "PULL" and reason_name(pull) == "VERIFIED_PREFIX"
    cold = opb.PlanTurnResponse(decision=opb.PLAN_DECISION_COLD, kv_transfer_params_json='{"do_remote_decode": true}')
    assert pull_params(cold) is None and decision_name(cold) == "COLD"
