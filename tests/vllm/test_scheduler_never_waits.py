"""The engine never waits for Boomerang: plans in the background, inside vLLM 0.33.0's own
scheduler, against real Boomerang processes and a router that a relay holds far away.

A P engine whose plan is in flight answers vLLM's "ask again later"; vLLM skips that request
for the step and schedules the others. These tests hold every `schedule()` to a budget far
below the router's delay (a plan that blocked would cost a whole delay), and check what
happens to the plans: the late ones PULL, the abandoned ones give their claim back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from boomerang.v1 import types_pb2 as tpb
from boomerang_tools.bench.schedule import DelayRelay

from tests.support.procs import ServiceProcess, wait_for
from tests.vllm.engine import build_engine
from tests.vllm.test_scheduler_hook import Pair, first_turn, in_pool, leases, retained, whole_blocks

pytestmark = pytest.mark.vllm


@pytest.fixture
def relay(router: ServiceProcess) -> Iterator[DelayRelay]:
    made = DelayRelay(router.address).start()
    yield made
    made.stop()


def far_pair(model_dir: Path, registry: ServiceProcess, router: ServiceProcess, relay: DelayRelay, tag: str,
             **prefill: object) -> Pair:
    pair = Pair(model_dir, registry, relay.address, tag, **prefill)
    assert wait_for(lambda: in_pool(router, pair.d.engine_id, pair.p.engine_id), 20), "engines never joined the pool"
    watch_network_threads(pair)
    return pair


def watch_network_threads(pair: Pair) -> None:
    """Record the thread of every call the hooks make to Boomerang (plans, reports, registrations,
    heartbeats): the property under test is that none is the scheduler's (this test's) thread."""
    pair.network_threads = set()  # type: ignore[attr-defined]
    clients = [pair.p.hook.planner.client, pair.p.hook.reporter.client, pair.d.hook.sender.client]
    for client in clients:
        for name in dir(client):
            method = getattr(client, name)
            if name.startswith("_") or not callable(method) or name in ("close",):
                continue

            def recorded(*args: object, _method: object = method, **kwargs: object) -> object:
                pair.network_threads.add(threading.get_ident())  # type: ignore[attr-defined]
                return _method(*args, **kwargs)  # type: ignore[operator]

            setattr(client, name, recorded)


def no_network_on_the_scheduler_thread(pair: Pair) -> bool:
    return threading.get_ident() not in pair.network_threads  # type: ignore[attr-defined]


def first_lease(pair: Pair, conversation: str, prompt: list[int]) -> list[int]:
    """Turn 1 with the router near; returns the next turn's prompt (the whole history)."""
    _, d_done = pair.turn(conversation, prompt)
    assert wait_for(lambda: len(retained(pair.registry, pair.tenant, conversation)) == 1, 10)
    return prompt + d_done.output_token_ids + [17] * 20


@pytest.mark.parametrize("delay_ms", [80, 300])
def test_a_far_router_holds_no_step_and_the_turn_still_pulls(model_dir: Path, registry: ServiceProcess,
                                                           router: ServiceProcess, reaper: ServiceProcess,
                                                           relay: DelayRelay, unique: str, delay_ms: int) -> None:
    pair = far_pair(model_dir, registry, router, relay, unique)
    try:
        conversation = f"c-{unique}"
        history = first_lease(pair, conversation, list(range(1000, 1300)))
        lease = retained(pair.registry, pair.tenant, conversation)[0]
        relay.delay = delay_ms / 1000
        planned, plain = f"planned-{unique}", f"plain-{unique}"
        pair.p.submit(planned, history, 1, first_turn(conversation))
        # A prompt below the recompute threshold: a pull could not help it, so it waits for nothing.
        pair.p.submit(plain, list(range(5000, 5040)), 1, {k: v for k, v in first_turn("").items() if k != "boomerang"})
        before = len(pair.p.step_seconds)
        started = time.monotonic()
        done = pair.p.run([planned, plain])
        took = time.monotonic() - started
        steps = pair.p.step_seconds[before:]
        # The plain request went in the very first step; the planned one waited for its plan.
        assert plain in pair.p.new_per_step[before] and planned not in pair.p.new_per_step[before]
        assert took >= delay_ms / 1000
        # No schedule() waited for the router: no call to Boomerang was made on the scheduler's
        # thread, and the engine loop turned while the plan was in flight (a blocking plan would
        # have held one step for the whole delay, and there would be one or two steps).
        assert no_network_on_the_scheduler_thread(pair) and pair.network_threads  # type: ignore[attr-defined]
        assert len(steps) > 3, len(steps)
        print(f"router {delay_ms} ms away: {len(steps)} steps while planning, worst {max(steps) * 1000:.2f} ms")
        # ... and the plan, when it came, was a PULL: vLLM queued the receive from D.
        recv = pair.p.receives[planned]
        assert recv.remote.request_id == lease.remote_request_id and recv.remote.engine_id == pair.d.engine_id
        assert recv.remote.num_tokens == whole_blocks(lease.num_tokens)
        assert done[planned].kv_transfer_params is not None
        assert pair.p.hook.load() == (0, 0)
    finally:
        pair.shutdown()


def test_an_aborted_request_gives_back_the_claim_its_late_plan_made(model_dir: Path, registry: ServiceProcess,
                                                                   router: ServiceProcess, reaper: ServiceProcess,
                                                                   relay: DelayRelay, unique: str) -> None:
    pair = far_pair(model_dir, registry, router, relay, unique)
    try:
        conversation = f"c-{unique}"
        history = first_lease(pair, conversation, list(range(2000, 2300)))
        lease = retained(pair.registry, pair.tenant, conversation)[0]
        relay.delay = 0.3
        rid = f"aborted-{unique}"
        pair.p.submit(rid, history, 1, first_turn(conversation))
        pair.p.step()  # the plan starts; the request waits for it
        assert pair.p.hook.stats()["plans_in_flight"] == 1
        time.sleep(0.05)  # it left the engine and sits in the relay
        pair.p.abort([rid])
        assert pair.p.hook.load() == (0, 0)  # nothing of the request is kept
        # The router claims the lease for an answer nobody waits for; the hook gives it back.
        assert wait_for(lambda: pair.p.hook.stats().get("late_given_back") == 1, 10), pair.p.hook.stats()
        assert wait_for(lambda: [ls.state for ls in leases(pair.registry, pair.tenant, conversation)]
                        == [tpb.LEASE_STATE_RETAINED], 10), leases(pair.registry, pair.tenant, conversation)
        # Not stranded: the conversation's next turn pulls that very lease.
        relay.delay = 0.0
        p_done, _ = pair.turn(conversation, history)
        assert pair.p.receives[p_done.request_id].remote.request_id == lease.remote_request_id
    finally:
        pair.shutdown()


def test_a_preempted_request_whose_plan_came_late_strands_nothing(model_dir: Path, registry: ServiceProcess,
                                                                 router: ServiceProcess, reaper: ServiceProcess,
                                                                 relay: DelayRelay, unique: str) -> None:
    # The request waits 50 ms for its plan, then goes on without it; the plan comes at ~300 ms.
    pair = far_pair(model_dir, registry, router, relay, unique, plan_deadline_ms=50)
    try:
        conversation = f"c-{unique}"
        history = first_lease(pair, conversation, list(range(3000, 3300)))
        relay.delay = 0.3
        rid = f"preempted-{unique}"
        pair.p.submit(rid, history + list(range(9000, 9400)), 50, first_turn(conversation))
        end = time.monotonic() + 5
        while rid not in pair.p.scheduler.requests or pair.p.scheduler.requests[rid].num_computed_tokens == 0:
            pair.p.step()
            time.sleep(0.001)
            assert time.monotonic() < end, "never scheduled"
        assert pair.p.hook.counters["fallback_wait_over"] == 1 and rid not in pair.p.receives  # computed locally
        request = pair.p.scheduler.requests[rid]
        pair.p.scheduler.running.remove(request)
        pair.p.scheduler._preempt_request(request, time.monotonic())  # vLLM's own preemption path
        assert request.num_preemptions == 1
        done = pair.p.run([rid])
        assert done[rid].kv_transfer_params is not None and rid not in pair.p.receives
        assert pair.p.hook.load() == (0, 0)
        # The plan that came after the request went on gave its claim back: the lease is free.
        assert wait_for(lambda: pair.p.hook.stats().get("late_given_back") == 1, 10), pair.p.hook.stats()
        assert wait_for(lambda: [ls.state for ls in leases(pair.registry, pair.tenant, conversation)]
                        == [tpb.LEASE_STATE_RETAINED], 10), leases(pair.registry, pair.tenant, conversation)
    finally:
        pair.shutdown()


def test_with_plans_in_flight_the_worst_step_is_the_worst_step_without_boomerang(
        model_dir: Path, registry: ServiceProcess, router: ServiceProcess, reaper: ServiceProcess,
        relay: DelayRelay, unique: str) -> None:
    """The issue's target, on the same machine in the same run: a P engine with Boomerang and
    a router 150 ms away, against the same workload on vLLM's own NixlConnector."""
    pair = far_pair(model_dir, registry, router, relay, unique)
    plain = build_engine(model_dir, f"plain-{unique}", {"role": "prefill"})
    try:
        conversations = [f"c{i}-{unique}" for i in range(16)]
        histories = {c: first_lease(pair, c, list(range(100 + 7 * i, 420 + 7 * i))) for i, c in enumerate(conversations)}
        relay.delay = 0.15

        def worst_step(engine: object, with_context: bool) -> float:
            e = engine  # type: ignore[assignment]
            rids = []
            for i, c in enumerate(conversations):
                rid = f"w-{with_context}-{c}"
                params = first_turn(c) if with_context else {k: v for k, v in first_turn(c).items() if k != "boomerang"}
                e.submit(rid, histories[c], 1, params)  # type: ignore[attr-defined]
                rids.append(rid)
            before = len(e.step_seconds)  # type: ignore[attr-defined]
            e.run(rids)  # type: ignore[attr-defined]
            return max(e.step_seconds[before:]) * 1000  # type: ignore[attr-defined, no-any-return]

        absent = worst_step(plain, False)
        present = worst_step(pair.p, True)
        print(f"worst schedule(), 16 requests: Boomerang absent {absent:.2f} ms, plans in flight {present:.2f} ms")
        assert pair.p.hook.counters["plan_pull"] == 16
        # The figures depend on the host (a busy one stalls any step); what does not: no call to
        # Boomerang on the scheduler's thread. The bench reports the hook's time per step.
        assert no_network_on_the_scheduler_thread(pair) and pair.network_threads  # type: ignore[attr-defined]
    finally:
        plain.shutdown()
        pair.shutdown()
