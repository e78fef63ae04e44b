"""Boomerang's hook inside vLLM 0.33.0's own scheduler, against real Boomerang processes.

Prefill (P) and decode (D) engines are vLLM's v1 `Scheduler` with the connector vLLM builds
from the README's `--kv-transfer-config`; the registry, router and reaper are `boomerang`
processes on a real Postgres. The turns flow as a P/D proxy drives them: P gets the prompt
with `max_tokens=1` and the first-turn params, D gets P's returned params, and the next turn
extends the whole history.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.sync import SyncRegistryClient, SyncRouterClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import router_service_pb2 as opb
from boomerang.v1 import types_pb2 as tpb

from tests.support.procs import ServiceProcess, wait_for
from tests.vllm.conftest import ROUTER_ENV
from tests.vllm.engine import BLOCK_SIZE, MODEL, Engine, Finished, MatchCall, build_engine

pytestmark = pytest.mark.vllm
THRESHOLD = 64  # kv_recompute_threshold in the README's config


def first_turn(conversation: str) -> dict[str, Any]:
    """What a P/D proxy sends P: the NixlConnector's first-turn params and the conversation."""
    return {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
            "remote_block_ids": None, "remote_host": None, "remote_port": None,
            "boomerang": {"conversation_id": conversation}}


def leases(registry: ServiceProcess, tenant: str, conversation: str) -> list[tpb.Lease]:
    """The conversation's leases, oldest first (none before its first registration)."""
    with SyncRegistryClient(registry.address) as client:
        try:
            got = client.get_conversation(rpb.GetConversationRequest(tenant=tenant, conversation_id=conversation))
        except BoomerangClientError as err:
            if err.reason != "CONVERSATION_NOT_FOUND":
                raise
            return []
    return sorted(got.leases, key=lambda ls: ls.create_time.ToNanoseconds())


def in_pool(router: ServiceProcess, *engine_ids: str) -> bool:
    with SyncRouterClient(router.address) as client:
        try:
            pool = client.list_engines(opb.RouterServiceListEnginesRequest(model=MODEL)).engines
        except BoomerangClientError as err:
            if err.code != "UNAVAILABLE":
                raise
            return False  # still starting
    return set(engine_ids) <= {e.engine.engine_id for e in pool if e.available}


def retained(registry: ServiceProcess, tenant: str, conversation: str) -> list[tpb.Lease]:
    return [ls for ls in leases(registry, tenant, conversation) if ls.state == tpb.LEASE_STATE_RETAINED]


def final_match(engine: Engine, rid: str) -> MatchCall:
    """vLLM's last `get_num_new_matched_tokens` call for a request: the one that answered (the
    earlier ones, while its plan was in flight, said "ask again later")."""
    calls = [c for c in engine.matches if c.request_id == rid]
    assert calls and calls[-1].result[0] is not None, calls
    assert all(c.result == (None, False) for c in calls[:-1]), calls
    return calls[-1]


def whole_blocks(tokens: int) -> int:
    return tokens // BLOCK_SIZE * BLOCK_SIZE


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Pair:
    """One P and one D engine serving one tenant, and the turns a proxy drives through them."""

    def __init__(self, model_dir: Path, registry: ServiceProcess, router: ServiceProcess | str, tag: str, **prefill: Any):
        self.tenant = f"t-{tag}"
        self.registry = registry
        common = {"tenant": self.tenant, "registry": registry.address, "heartbeat_interval_seconds": 0.5}
        self.d = build_engine(model_dir, f"d-{tag}", {"role": "decode", "http_base_url": "http://127.0.0.1:8200", **common})
        # A prefill token is valued at 10 ms, so a few hundred tokens are worth the whole
        # `plan_deadline_ms` of waiting: these tests are about what the plans do, not their worth.
        self.p = build_engine(model_dir, f"p-{tag}", {
            "role": "prefill", "router": router if isinstance(router, str) else router.address, "http_base_url": "http://127.0.0.1:8100",
            "plan_deadline_ms": 1000, "prefill_ms_per_token": 10.0, **common, **prefill,
        })
        self.turns = 0

    def prefill(self, rid: str, prompt: list[int], conversation: str) -> Finished:
        self.p.submit(rid, prompt, 1, first_turn(conversation))
        return self.p.run([rid])[rid]

    def decode(self, rid: str, prompt: list[int], params: dict[str, Any], max_tokens: int) -> Finished:
        self.d.submit(rid, prompt, max_tokens, params)
        return self.d.run([rid])[rid]

    def turn(self, conversation: str, prompt: list[int], max_tokens: int = 40) -> tuple[Finished, Finished]:
        """P then D, as a P/D proxy runs one turn; returns both engines' results."""
        self.turns += 1
        p_done = self.prefill(f"p-{conversation}-{self.turns}", prompt, conversation)
        assert p_done.kv_transfer_params is not None and p_done.kv_transfer_params["do_remote_prefill"] is True
        d_done = self.decode(f"d-{conversation}-{self.turns}", prompt, p_done.kv_transfer_params, max_tokens)
        return p_done, d_done

    def shutdown(self) -> None:
        self.p.shutdown()
        self.d.shutdown()


@pytest.fixture
def pair(model_dir: Path, registry: ServiceProcess, router: ServiceProcess, reaper: ServiceProcess,
         unique: str) -> Iterator[Pair]:
    made = Pair(model_dir, registry, router, unique)
    assert wait_for(lambda: in_pool(router, made.d.engine_id, made.p.engine_id), 20), "engines never joined the pool"
    yield made
    made.shutdown()


def test_multi_turn_decode_registers_every_turn_and_prefill_pulls(pair: Pair, unique: str) -> None:
    conversation = f"c-{unique}"
    history = list(range(1000, 1300))
    d_prev = None  # the decode engine's previous turn, from turn 2 on
    for turn in range(1, 5):
        p_done, d_done = pair.turn(conversation, history)
        rid_p = p_done.request_id
        # vLLM's scheduler tells D (and the gateway) how many prompt tokens P did not compute.
        cached = p_done.kv_transfer_params["remote_prefill_cached_tokens"]
        if turn == 1:
            # A new conversation: the live-lease summary starts it at once, or (before its first
            # snapshot) the router answers COLD.
            assert pair.p.hook.counters["plan_cold"] + pair.p.hook.counters["summary_ruled_out"] == 1
            assert rid_p not in pair.p.receives
            assert cached == 0
        else:
            # P planned PULL; vLLM's own connector counted min(remote_num_tokens, prompt) tokens
            # to load and queued the NIXL receive from D's previous request with that count.
            previous = d_prev
            assert previous is not None
            held = previous.kv_transfer_params["remote_num_tokens"]
            expected = whole_blocks(held)  # D's trailing partial block cannot be verified
            call = final_match(pair.p, rid_p)
            assert call.result == (expected, True), (call, pair.p.hook.stats())
            assert call.remote_num_tokens == expected
            assert cached == expected  # every pulled token, as the gateway's delivered reuse
            recv = pair.p.receives[rid_p]
            assert recv.remote.request_id == previous.request_id and recv.remote.engine_id == pair.d.engine_id
            assert recv.remote.num_tokens == expected
            # The handle names D's blocks of that prefix, and no more.
            d_blocks = list(previous.kv_transfer_params["remote_block_ids"][0])
            assert [list(g) for g in recv.remote.block_ids] == [d_blocks[: expected // BLOCK_SIZE]]
            assert pair.p.hook.counters["plan_pull"] == turn - 1
        # D registered the turn it finished: its handle became the conversation's live lease.
        handle = d_done.kv_transfer_params
        assert handle is not None and isinstance(handle["remote_block_ids"], tuple)  # vLLM 0.33 inside the engine
        assert wait_for(lambda d_done=d_done: any(ls.remote_request_id == d_done.request_id
                                                  for ls in retained(pair.registry, pair.tenant, conversation)), 10), pair.d.hook.stats()
        lease = retained(pair.registry, pair.tenant, conversation)[-1]
        assert lease.num_tokens == handle["remote_num_tokens"] == len(history) + len(d_done.output_token_ids) - 1
        assert [list(g.block_ids) for g in lease.block_groups] == [list(g) for g in handle["remote_block_ids"]]
        d_prev = d_done
        history = history + d_done.output_token_ids + list(range(5000 + turn * 100, 5000 + turn * 100 + 37))
    every = leases(pair.registry, pair.tenant, conversation)
    assert len(every) == 4
    # All of it with the roles vLLM 0.33.0 asks for (it deprecates kv_both for the NixlConnector).
    assert pair.p.scheduler.vllm_config.kv_transfer_config.kv_role == "kv_producer"
    assert pair.d.scheduler.vllm_config.kv_transfer_config.kv_role == "kv_consumer"
    # Every pulled lease was consumed once P reported the read; none is handed out again.
    assert wait_for(lambda: sum(ls.state == tpb.LEASE_STATE_CONSUMED
                                for ls in leases(pair.registry, pair.tenant, conversation)) == 3, 10)
    assert pair.d.hook.stats()["sender"]["registered"] == 4
    # Every request ended: the hooks hold nothing, so the heartbeats' load is back to zero.
    assert pair.p.hook.load() == (0, 0) and pair.d.hook.load() == (0, 0)


@pytest.mark.parametrize("edit", ["stripped_reasoning", "edited_early", "edited_late"])
def test_changed_history_never_loads_past_the_common_prefix(pair: Pair, unique: str, edit: str) -> None:
    conversation = f"c-{edit}-{unique}"
    prompt1 = list(range(3000, 3400))
    _, d_done = pair.turn(conversation, prompt1, max_tokens=60)
    held = prompt1 + d_done.output_token_ids
    assert wait_for(lambda: len(retained(pair.registry, pair.tenant, conversation)) == 1, 10)
    if edit == "stripped_reasoning":
        # The chat template drops the reasoning (the first 45 generated tokens) from history.
        prompt2 = prompt1 + d_done.output_token_ids[45:] + list(range(8000, 8050))
    elif edit == "edited_early":
        prompt2 = list(prompt1)
        prompt2[30] = 7
        prompt2 += d_done.output_token_ids + list(range(8000, 8050))
    else:
        prompt2 = list(prompt1)
        prompt2[250] = 7
        prompt2 += d_done.output_token_ids + list(range(8000, 8050))
    true_common = common_prefix(held[: len(held) - 1], prompt2)  # D has KV for all but its last token
    rid = f"p2-{unique}"
    pair.p.submit(rid, prompt2, 1, first_turn(conversation))
    pair.p.run([rid])
    call = final_match(pair.p, rid)
    loaded = call.result[0] or 0
    assert loaded <= true_common, (call, true_common)
    if whole_blocks(true_common) >= THRESHOLD:
        assert loaded == whole_blocks(true_common) and pair.p.receives[rid].remote.num_tokens == loaded
    else:
        assert loaded == 0
    assert pair.p.hook.load() == (0, 0)


def test_many_requests_in_one_scheduler_step(pair: Pair, unique: str) -> None:
    conversations = [f"c{i}-{unique}" for i in range(24)]
    prompts = {c: list(range(100 + i, 420 + i)) for i, c in enumerate(conversations)}
    # Turn 1 for all of them, batched: P sees 24 new requests in one step, D too.
    for c in conversations:
        pair.p.submit(f"p1-{c}", prompts[c], 1, first_turn(c))
    p_done = pair.p.run([f"p1-{c}" for c in conversations])
    for c in conversations:
        pair.d.submit(f"d1-{c}", prompts[c], 30, p_done[f"p1-{c}"].kv_transfer_params)
    d_done = pair.d.run([f"d1-{c}" for c in conversations])
    assert wait_for(lambda: pair.d.hook.stats()["sender"]["registered"] == 24, 20), pair.d.hook.stats()
    # Turn 2 for all of them in one step: each gets its own lease, none another's.
    for c in conversations:
        prompt2 = prompts[c] + d_done[f"d1-{c}"].output_token_ids + [9, 9, 9]
        pair.p.submit(f"p2-{c}", prompt2, 1, first_turn(c))
    steps_before = len(pair.p.step_seconds)
    pair.p.run([f"p2-{c}" for c in conversations])
    assert pair.p.hook.counters["plan_pull"] == 24, dict(pair.p.hook.counters)
    for c in conversations:
        recv = pair.p.receives[f"p2-{c}"]
        assert recv.remote.request_id == f"d1-{c}"
        assert recv.remote.num_tokens == whole_blocks(len(prompts[c]) + 30 - 1)
    # The first step started all 24 plans and scheduled none of them: the plans are in the
    # background, and each request was scheduled once its own plan was in.
    assert pair.p.scheduled[steps_before] == 0 and pair.p.hook.counters["plans_started"] >= 24
    assert pair.p.hook.load() == (0, 0) and pair.d.hook.load() == (0, 0)


def test_aborted_and_preempted_requests_leak_nothing(pair: Pair, unique: str) -> None:
    conversation = f"c-{unique}"
    prompt = list(range(600, 900))
    p_done = pair.prefill(f"p-{unique}", prompt, conversation)
    # D aborts the request mid-decode (the client went away): no handle, no lease.
    rid = f"d-abort-{unique}"
    pair.d.submit(rid, prompt, 500, p_done.kv_transfer_params)
    for _ in range(5):
        pair.d.step()
    assert pair.d.hook.load()[0] == 1
    pair.d.abort([rid])
    assert pair.d.hook.load() == (0, 0)
    # P aborts a request while it still waits in the queue (never scheduled).
    waiting = f"p-wait-{unique}"
    pair.p.submit(waiting, prompt, 1, first_turn(conversation))
    pair.p.abort([waiting])
    assert pair.p.hook.load() == (0, 0)
    time.sleep(1.0)  # anything wrongly queued would have reached the registry by now
    assert leases(pair.registry, pair.tenant, conversation) == []
    assert pair.d.hook.counters["registrations_queued"] == 0

    # Preemption: vLLM frees the running request's blocks and re-queues it; the hook counts
    # its prompt as waiting again, then registers it once when it finally finishes.
    rid = f"d-preempt-{unique}"
    pair.d.submit(rid, prompt, 20, p_done.kv_transfer_params)
    for _ in range(3):
        pair.d.step()
    request = pair.d.scheduler.requests[rid]
    pair.d.scheduler.running.remove(request)
    pair.d.scheduler._preempt_request(request, time.monotonic())  # vLLM's own preemption path
    assert request.num_preemptions == 1
    pair.d.step()  # asks the connector again, reallocates
    done = pair.d.run([rid])[rid]
    assert done.kv_transfer_params is not None
    assert wait_for(lambda: len(retained(pair.registry, pair.tenant, conversation)) == 1, 10)
    assert pair.d.hook.counters["registrations_queued"] == 1
    assert pair.d.hook.load() == (0, 0)


def _plan_free_step(engine: Engine, rid: str, conversation: str, prompt: list[int]) -> float:
    engine.submit(rid, prompt, 1, first_turn(conversation))
    before = len(engine.step_seconds)
    engine.run([rid])
    return max(engine.step_seconds[before:])


def test_control_plane_stopped_hanging_and_restarted(model_dir: Path, database_url: str, registry: ServiceProcess,
                                                      reaper: ServiceProcess, unique: str) -> None:
    router = ServiceProcess(["router", "--listen", "127.0.0.1:0", "--registry", registry.address,
                             "--engine-refresh-seconds", "0.2"], {"BOOMERANG_DATABASE_URL": database_url, **ROUTER_ENV}).start()
    # A plan call that blocked would cost a step the whole deadline; no step may come close.
    deadline_ms, step_budget_ms = 200, 100
    # The hanging requests below are new conversations, which the live-lease summary would start
    # at once: without it they wait for a hanging router, which is what this test is about.
    pair = Pair(model_dir, registry, router, unique, plan_deadline_ms=deadline_ms, breaker_failures=3,
                breaker_cooldown_seconds=0.5, lease_summary=False)
    try:
        assert wait_for(lambda: in_pool(router, pair.d.engine_id, pair.p.engine_id), 20)
        conversation = f"c-{unique}"
        history = list(range(4000, 4300))
        _, d_done = pair.turn(conversation, history)
        history = history + d_done.output_token_ids + [11] * 20
        assert wait_for(lambda: len(retained(registry, pair.tenant, conversation)) == 1, 10)

        # Hanging: the router stops answering (SIGSTOP). Many requests arrive at once; each
        # waits its plan's budget while the steps go on, then computes locally.
        os.killpg(router.proc.pid, signal.SIGSTOP)
        try:
            for i in range(8):
                pair.p.submit(f"hang{i}-{unique}", list(range(7000 + i, 7300 + i)), 1, first_turn(f"h{i}-{unique}"))
            before = len(pair.p.step_seconds)
            started = time.monotonic()
            pair.p.run([f"hang{i}-{unique}" for i in range(8)])
            assert time.monotonic() - started >= deadline_ms / 1000  # they did wait for their plans ...
            worst = max(pair.p.step_seconds[before:]) * 1000
            assert worst < step_budget_ms, worst  # ... but no step did
            stats = pair.p.hook.stats()
            assert stats.get("fallback_wait_over", 0) + stats.get("fallback_deadline_exceeded", 0) == 8, stats
            # The failed plans opened the breaker: later requests start no plan and wait for nothing.
            assert wait_for(lambda: not pair.p.hook.planner.allow(), 5)
            for i in range(4):
                worst = _plan_free_step(pair.p, f"hang-next{i}-{unique}", f"hn{i}-{unique}", list(range(300))) * 1000
                assert worst < step_budget_ms, worst
            assert pair.p.hook.counters["fallback_breaker_open"] >= 1
        finally:
            os.killpg(router.proc.pid, signal.SIGCONT)

        # Stopped: the router is gone; every request still runs, each step within budget.
        port = router.port
        router.kill()
        for i in range(4):
            worst = _plan_free_step(pair.p, f"down{i}-{unique}", f"d{i}-{unique}", list(range(300))) * 1000
            assert worst < step_budget_ms, worst
        assert pair.p.hook.counters["hook_errors"] == 0

        # Restarted: a new router process on the same address; after the breaker's pause,
        # the engine's own channel reconnects and reuse comes back.
        router = ServiceProcess(["router", "--listen", f"127.0.0.1:{port}", "--registry", registry.address,
                                 "--engine-refresh-seconds", "0.2"], {"BOOMERANG_DATABASE_URL": database_url, **ROUTER_ENV}).start()
        assert wait_for(lambda: in_pool(router, pair.d.engine_id, pair.p.engine_id), 20), (router.address, router.output())
        pulls = pair.p.hook.counters["plan_pull"]

        def pulls_again() -> bool:
            rid = f"again{pair.turns}-{unique}"
            pair.turns += 1
            pair.p.submit(rid, history, 1, first_turn(conversation))
            pair.p.run([rid])
            return pair.p.hook.counters["plan_pull"] > pulls

        assert wait_for(pulls_again, 15, interval=0.3), pair.p.hook.stats()
        assert pair.p.hook.counters["hook_errors"] == 0
    finally:
        pair.shutdown()
        router.kill()


def test_registry_hanging_stopped_and_restarted(model_dir: Path, database_url: str, router: ServiceProcess,
                                                reaper: ServiceProcess, unique: str) -> None:
    """D's side of the control plane: the registry hangs, dies and comes back. D's steps never
    wait on it, nothing raises, and the turns D finished meanwhile are registered after the
    restart, so P pulls again."""
    registry = ServiceProcess(["registry", "--listen", "127.0.0.1:0"], {"BOOMERANG_DATABASE_URL": database_url}).start()
    pair = Pair(model_dir, registry, router, unique)
    budget_ms = 100  # D makes no network call on the scheduler thread at all
    try:
        assert wait_for(lambda: in_pool(router, pair.d.engine_id, pair.p.engine_id), 20)
        conversation = f"c-{unique}"
        history = list(range(2000, 2300))
        _, d_done = pair.turn(conversation, history)
        assert wait_for(lambda: len(retained(registry, pair.tenant, conversation)) == 1, 10)

        os.killpg(registry.proc.pid, signal.SIGSTOP)  # hanging
        history = history + d_done.output_token_ids + [12] * 20
        before = len(pair.d.step_seconds)
        _, d_hung = pair.turn(conversation, history)
        assert pair.p.hook.counters["plan_pull"] == 1  # the router still plans from turn 1's lease
        port = registry.port
        registry.kill()  # stopped (killed while hanging)
        history = history + d_hung.output_token_ids + [13] * 20
        _, d_down = pair.turn(conversation, history)
        worst = max(pair.d.step_seconds[before:]) * 1000
        assert worst < budget_ms, worst
        assert pair.d.hook.counters["hook_errors"] == 0 and pair.p.hook.counters["hook_errors"] == 0
        assert pair.d.hook.counters["registrations_queued"] == 3

        # Restarted on the same address: the queued registrations land, and P pulls D's latest turn.
        registry = ServiceProcess(["registry", "--listen", f"127.0.0.1:{port}"],
                                  {"BOOMERANG_DATABASE_URL": database_url}).start()

        def registered_again() -> bool:
            try:
                return any(ls.remote_request_id == d_down.request_id for ls in retained(registry, pair.tenant, conversation))
            except BoomerangClientError as err:  # this process's channels to the address are still backing off
                if err.code != "UNAVAILABLE":
                    raise
                return False

        assert wait_for(registered_again, 20), (pair.d.hook.stats(), registry.output())
        history = history + d_down.output_token_ids + [14] * 20
        p_again, _ = pair.turn(conversation, history)
        recv = pair.p.receives[p_again.request_id]
        assert recv.remote.request_id == d_down.request_id
        assert recv.remote.num_tokens == whole_blocks(d_down.kv_transfer_params["remote_num_tokens"])
        assert pair.p.hook.load() == (0, 0) and pair.d.hook.load() == (0, 0)
    finally:
        pair.shutdown()
        registry.kill()
