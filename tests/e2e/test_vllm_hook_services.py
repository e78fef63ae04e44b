"""The hook against real `boomerang registry` and `boomerang router` processes.

The engines are the stand-in NixlConnector (docs/vllm-contract.md) with Boomerang's connector
overrides on top, talking gRPC to the services exactly as inside vLLM: the decode side
registers turn 1 through the registry; the prefill side gets a PULL plan for turn 2 from
the router with `remote_num_tokens` equal to the verified whole-block prefix; with the
router down or hanging, the prefill side computes locally within its deadline.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.sync import SyncRegistryClient, SyncRouterClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import router_service_pb2 as opb
from boomerang.v1 import types_pb2 as tpb
from boomerang_vllm_hook.connector import BoomerangConnectorMixin

from tests.support.procs import ServiceProcess, wait_for
from tests.support.router_stack import running_registry, running_router
from tests.support.vllm_standin import (
    KVConnectorRole,
    Request,
    StandInNixlConnector,
    ask,
    block_ids_for,
    vllm_config,
)

pytestmark = pytest.mark.e2e
BLOCK = 16


class Connector(BoomerangConnectorMixin, StandInNixlConnector):
    """What `BoomerangConnector` is inside vLLM, over the stand-in."""


def extra(role: str, **more: Any) -> dict[str, Any]:
    # A prefill token valued at 1 ms: a 300-token prompt is worth the whole plan deadline.
    b: dict[str, Any] = {"role": role, "heartbeat_interval_seconds": 1, **more}
    if role == "prefill":
        b.setdefault("prefill_ms_per_token", 1.0)
    return {"bidirectional_kv_xfer": True, "decoder_kv_blocks_ttl": 480, "kv_recompute_threshold": 64, "boomerang": b}


@pytest.fixture(scope="module")
def registry(database_url: str) -> Iterator[ServiceProcess]:
    with running_registry(database_url) as proc:
        yield proc


@pytest.fixture(scope="module")
def router(database_url: str, registry: ServiceProcess) -> Iterator[ServiceProcess]:
    with running_router(database_url, registry.address, patient=False) as proc:
        yield proc


@pytest.fixture
def engines() -> Iterator[list[Connector]]:
    made: list[Connector] = []
    yield made
    for conn in made:
        conn.shutdown()


def start(made: list[Connector], engine_id: str, cfg: dict[str, Any]) -> Connector:
    conn = Connector(vllm_config(engine_id, cfg, block_size=BLOCK), KVConnectorRole.SCHEDULER)
    made.append(conn)
    return conn


def in_pool(router: ServiceProcess, *engine_ids: str) -> bool:
    with SyncRouterClient(router.address) as client:
        pool = client.list_engines(opb.RouterServiceListEnginesRequest(model="qwen3-32b")).engines
    available = {e.engine.engine_id for e in pool if e.available}
    return set(engine_ids) <= available


def leases(registry: ServiceProcess, tenant: str, conversation: str, events: bool = False) -> rpb.GetConversationResponse:
    """The conversation's leases (and events); empty before its first lease."""
    with SyncRegistryClient(registry.address) as client:
        try:
            return client.get_conversation(
                rpb.GetConversationRequest(tenant=tenant, conversation_id=conversation, include_events=events)
            )
        except BoomerangClientError as err:
            if err.reason != "CONVERSATION_NOT_FOUND":
                raise
            return rpb.GetConversationResponse()


def test_decode_registers_and_prefill_pulls_the_next_turn(
    registry: ServiceProcess, router: ServiceProcess, engines: list[Connector], unique: str
) -> None:
    tenant, conversation = f"t-{unique}", f"c-{unique}"
    d = start(engines, f"d-{unique}", extra("decode", registry=registry.address, tenant=tenant,
                                          http_base_url="http://127.0.0.1:8200"))
    # A roomy deadline: this test is about the plan's content; the deadline has its own tests
    # below, and a loaded CI box must not turn a PULL into a fallback here.
    p = start(engines, f"p-{unique}", extra("prefill", registry=registry.address, router=router.address,
                                          tenant=tenant, http_base_url="http://127.0.0.1:8100", plan_deadline_ms=1000))
    assert wait_for(lambda: in_pool(router, d.engine_id, p.engine_id), 15), "engines never joined the router's pool"
    first_turn = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None,
                  "boomerang": {"conversation_id": conversation}}

    # Turn 1 on P: nothing to reuse, so P computes; its params carry the conversation to D.
    prompt1 = list(range(2000, 2200))
    p1 = Request("p-turn-1", prompt1, dict(first_turn))
    assert ask(p, p1, 0) == (0, False)
    p.update_state_after_alloc(p1, None, 0)
    p1.status = "FINISHED_LENGTH_CAPPED"
    _, to_d = p.request_finished_all_groups(p1, block_ids_for(len(prompt1), BLOCK))
    assert to_d is not None and to_d["boomerang"] == {"tenant": tenant, "conversation_id": conversation}

    # Turn 1 on D: reads P's KV, generates (reasoning included), keeps every block.
    output1 = list(range(7000, 7038))  # D computed KV for 200 + 38 − 1 = 237 tokens
    d1 = Request("d-turn-1", prompt1, to_d, output_token_ids=output1)
    assert d.get_num_new_matched_tokens(d1, 0) == (len(prompt1), True)
    d1.status = "FINISHED_STOPPED"
    _, handle = d.request_finished_all_groups(d1, block_ids_for(237, BLOCK, start=300))
    assert handle is not None and handle["remote_num_tokens"] == 237

    def retained() -> list[tpb.Lease]:
        return [ls for ls in leases(registry, tenant, conversation).leases if ls.state == tpb.LEASE_STATE_RETAINED]

    assert wait_for(lambda: len(retained()) == 1, 10), d.boomerang.stats()
    lease = retained()[0]
    assert (lease.engine_id, lease.remote_request_id, lease.num_tokens) == (d.engine_id, "d-turn-1", 237)
    assert [list(g.block_ids) for g in lease.block_groups] == list(block_ids_for(237, BLOCK, start=300))

    # Turn 2 on P: the prompt extends everything D holds; P is told to pull the whole blocks.
    prompt2 = prompt1 + output1 + list(range(3000, 3050))
    p2 = Request("p-turn-2", prompt2, dict(first_turn))
    count, is_async = ask(p, p2, 0)
    params = p2.kv_transfer_params
    assert params is not None
    verified = (237 // BLOCK) * BLOCK  # 224: D's trailing partial block cannot be verified against a longer prompt
    assert params["remote_num_tokens"] == verified and (count, is_async) == (verified, True)
    assert (params["remote_engine_id"], params["remote_request_id"]) == (d.engine_id, "d-turn-1")
    assert params["remote_block_ids"] == [list(range(300, 300 + verified // BLOCK))]
    assert (params["remote_host"], params["remote_port"], params["transfer_mode"]) == ("127.0.0.1", 5600, "pull")
    assert params["do_remote_decode"] is True and params["boomerang"] == {"conversation_id": conversation}

    p.update_state_after_alloc(p2, None, count)
    assert p.pulls == [("p-turn-2", "d-turn-1", verified)]
    p2.status = "FINISHED_LENGTH_CAPPED"
    p.request_finished_all_groups(p2, block_ids_for(len(prompt2), BLOCK))
    # The report settles the claim: the lease was read once and is never handed out again.
    assert wait_for(lambda: leases(registry, tenant, conversation).leases[0].state == tpb.LEASE_STATE_CONSUMED, 10), \
        p.boomerang.stats()
    reporter = p.boomerang.stats()["reporter"]
    assert reporter["reported"] == 2
    # Over ReportTurnBatch (the router has it): no single ReportTurn call, nothing refused.
    assert reporter["batch_calls"] >= 1
    assert reporter["rejected"] == {}
    assert d.boomerang.stats()["sender"]["registered"] == 1


def test_gateway_and_hook_both_report_one_turn(
    registry: ServiceProcess, router: ServiceProcess, engines: list[Connector], unique: str
) -> None:
    """The gateway reports each turn through ReportTurn; the decode hook registers it too.
    Whichever lands first makes the lease; the other finds it (one lease, one event)."""
    tenant = f"t-{unique}"
    d = start(engines, f"d-{unique}", extra("decode", registry=registry.address, tenant=tenant,
                                          http_base_url="http://127.0.0.1:8201"))
    p = start(engines, f"p-{unique}", extra("prefill", registry=registry.address, router=router.address,
                                          tenant=tenant, http_base_url="http://127.0.0.1:8101"))
    assert wait_for(lambda: in_pool(router, d.engine_id, p.engine_id), 15)
    prompt, output = list(range(100)), list(range(500, 520))

    def decode_turn(conversation: str, rid: str) -> tuple[Request, dict[str, Any]]:
        req = Request(rid, prompt, {"do_remote_prefill": True, "boomerang": {"conversation_id": conversation}},
                      output_token_ids=output, status="FINISHED_STOPPED")
        _, handle = d.request_finished_all_groups(req, block_ids_for(120, BLOCK))
        assert handle is not None
        return req, handle

    def gateway_plan(conversation: str) -> str:
        with SyncRouterClient(router.address) as client:
            return client.plan_turn(opb.PlanTurnRequest(tenant=tenant, conversation_id=conversation,
                                                        model="qwen3-32b", prompt_token_ids=prompt)).plan_id

    def gateway_report(plan_id: str, handle: dict[str, Any]) -> opb.ReportTurnResponse:
        with SyncRouterClient(router.address) as client:
            return client.report_turn(opb.ReportTurnRequest(
                tenant=tenant, plan_id=plan_id, handle_use=opb.HANDLE_USE_READ,
                decode_kv_transfer_params_json=json.dumps(handle), prompt_token_ids=prompt, output_token_ids=output))

    # The gateway plans the turn, D finishes it: the hook registers first, then the gateway reports.
    first = f"c1-{unique}"
    plan_id = gateway_plan(first)
    _, handle = decode_turn(first, f"rq1-{unique}")
    assert wait_for(lambda: d.boomerang.stats()["sender"]["registered"] == 1, 10)
    assert gateway_report(plan_id, handle).retention == opb.RETENTION_OUTCOME_ALREADY_REGISTERED

    # The other order: the gateway's report lands before the hook's registration.
    second = f"c2-{unique}"
    rid = f"rq2-{unique}"
    plan_id = gateway_plan(second)
    assert gateway_report(plan_id, {**handle, "remote_request_id": rid}).retention == opb.RETENTION_OUTCOME_REGISTERED
    decode_turn(second, rid)
    assert wait_for(lambda: d.boomerang.stats()["sender"]["duplicates"] == 1, 10), d.boomerang.stats()

    for conversation in (first, second):
        got = leases(registry, tenant, conversation, events=True)
        assert len(got.leases) == 1, got
        assert [e.reason for e in got.events] == ["REGISTERED"]


# A wait long enough that a call which blocked on its plan could not pass for one that did not,
# however busy the machine: 300 tokens at 10 ms × the 0.25 share is worth 750 ms; the deadline
# caps it at WAIT_MS. Bounds are then fractions or multiples of the wait, not a few milliseconds.
WAIT_MS = 500


def waiting(role: str, **more: Any) -> dict[str, Any]:
    return extra(role, plan_deadline_ms=WAIT_MS, prefill_ms_per_token=10.0, **more)


def test_router_down_prefill_computes_locally_and_never_waits(
    database_url: str, registry: ServiceProcess, engines: list[Connector], unique: str
) -> None:
    doomed = ServiceProcess(["router", "--listen", "127.0.0.1:0", "--registry", registry.address],
                            {"BOOMERANG_DATABASE_URL": database_url}).start()
    p = start(engines, f"p-{unique}", waiting("prefill", router=doomed.address, tenant=f"t-{unique}",
                                            breaker_failures=3, breaker_cooldown_seconds=30))
    doomed.kill()
    timings = []
    for i in range(6):
        req = Request(f"r{i}", list(range(300)), {"do_remote_decode": True, "boomerang": {"conversation_id": "c"}})
        while True:  # vLLM asks at each step until the hook answers
            begin = time.perf_counter()
            got = p.get_num_new_matched_tokens(req, 0)
            timings.append((time.perf_counter() - begin) * 1000)
            if got[0] is not None:
                break
            time.sleep(0.001)
        assert got == (0, False)
        assert req.kv_transfer_params == {"do_remote_decode": True, "boomerang": {"conversation_id": "c"}}
    # No call waits on the network: a call that held the scheduler for its plan would take the wait.
    assert max(timings) < WAIT_MS / 2, timings
    stats = p.boomerang.stats()
    failed = ("fallback_unavailable", "fallback_deadline_exceeded", "fallback_wait_over")  # however each ended
    assert sum(stats.get(k, 0) for k in failed) == 3, stats
    assert stats["fallback_breaker_open"] == 3 and stats["plans_started"] == 3, stats


@pytest.fixture
def hanging_router() -> Iterator[str]:
    """A router whose PlanTurn never answers (a stalled process): the connection is fine, the
    call hangs until its deadline. (A bare TCP listener would not do: with no HTTP/2 the channel
    gives up connecting after its 100 ms minimum and fails the call UNAVAILABLE, a down router.)"""
    released = threading.Event()

    def hang(request: bytes, context: grpc.ServicerContext) -> bytes:
        released.wait(60)
        return b""

    server = grpc.server(ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "boomerang.v1.RouterService", {"PlanTurn": grpc.unary_unary_rpc_method_handler(hang)})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    released.set()
    server.stop(0)


def test_hanging_router_holds_no_call_and_opens_the_breaker(
    engines: list[Connector], unique: str, hanging_router: str
) -> None:
    p = start(engines, f"p-{unique}", waiting("prefill", router=hanging_router, tenant=f"t-{unique}",
                                            breaker_failures=1, breaker_cooldown_seconds=30,
                                            rpc_timeout_seconds=0.2))
    first = Request("r0", list(range(300)), {"boomerang": {"conversation_id": "c"}})
    begin = time.perf_counter()  # the hook's clock; its wait starts inside the first call
    assert p.get_num_new_matched_tokens(first, 0) == (None, False)  # ask again later...
    assert (time.perf_counter() - begin) * 1000 < WAIT_MS / 2  # ...at once, not after the wait
    assert ask(p, first, 0) == (0, False)  # computed locally once its wait is over: not before, not long after
    assert WAIT_MS <= (time.perf_counter() - begin) * 1000 < 2 * WAIT_MS
    assert wait_for(lambda: not p.boomerang.planner.allow(), 5)  # the failed plan opened the breaker
    begin = time.perf_counter()
    for i in range(50):
        assert p.get_num_new_matched_tokens(Request(f"r{i + 1}", list(range(300)), {"boomerang": {"conversation_id": "c"}}), 0) == (0, False)
    # The breaker is open: nothing waits (fifty answers take less than one request's wait).
    assert (time.perf_counter() - begin) * 1000 < WAIT_MS
    stats = p.boomerang.stats()
    assert stats.get("fallback_wait_over", 0) + stats.get("fallback_deadline_exceeded", 0) == 1, stats
    assert stats["fallback_breaker_open"] == 50
