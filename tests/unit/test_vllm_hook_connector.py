"""The connector's three overrides over a stand-in NixlConnector (docs/vllm-contract.md), with
scripted registry and router clients: what reaches vLLM, the registry and the router."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from boomerang.tokenchain import build_chain
from boomerang.v1 import router_service_pb2 as opb
from boomerang_vllm_hook.config import HookConfig, HookConfigError
from boomerang_vllm_hook.connector import BoomerangConnectorMixin
from boomerang_vllm_hook.hook import BoomerangHook
from boomerang_vllm_hook.sender import EngineFacts

from tests.support.hook_fakes import FakeRegistry, FakeRouter, client_error
from tests.support.procs import wait_for
from tests.support.vllm_standin import (
    KVConnectorRole,
    Request,
    StandInNixlConnector,
    block_ids_for,
    vllm_config,
)

FIRST_TURN = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
              "remote_block_ids": None, "remote_host": None, "remote_port": None}


def extra(role: str, **more: Any) -> dict[str, Any]:
    # These engines value a token's prefill at 100 ms, so a 100-token prompt is worth the
    # longest wait (1 s): the planner thread sends well within it however busy the machine.
    # (With 25 ms, a thread kept off a core that long spent the wait before its request left,
    # and a test expecting a plan read "computed locally".)
    b: dict[str, Any] = {"role": role, "registry": "127.0.0.1:1", "router": "127.0.0.1:1", "tenant": "acme",
                         "heartbeat_interval_seconds": 30, "prefill_ms_per_token": 100.0, "plan_deadline_ms": 1000}
    b.update(more)
    return {"bidirectional_kv_xfer": True, "decoder_kv_blocks_ttl": 480, "kv_recompute_threshold": 64, "boomerang": b}


class Fakes:
    def __init__(self) -> None:
        self.registry = FakeRegistry()
        self.router = FakeRouter()
        self.background = FakeRouter()


@pytest.fixture
def fakes() -> Iterator[Fakes]:
    yield Fakes()


@pytest.fixture
def connector(fakes: Fakes) -> Iterator[Any]:
    made: list[Any] = []

    def factory(config: HookConfig, facts: EngineFacts) -> BoomerangHook:
        return BoomerangHook(config, facts, registry=fakes.registry, router=fakes.router,  # type: ignore[arg-type]
                             router_background=fakes.background)  # type: ignore[arg-type]

    class Connector(BoomerangConnectorMixin, StandInNixlConnector):
        hook_factory = staticmethod(factory)

    def build(engine_id: str, cfg: dict[str, Any], role: KVConnectorRole = KVConnectorRole.SCHEDULER) -> Any:
        conn = Connector(vllm_config(engine_id, cfg), role)
        made.append(conn)
        return conn

    yield build
    for conn in made:
        conn.shutdown()


def matched(conn: Any, req: Request, num_computed_tokens: int, timeout: float = 5.0) -> tuple[int | None, bool]:
    """`get_num_new_matched_tokens` as vLLM's scheduler asks it: again at each step while the
    answer is "ask again later" (None)."""
    end = time.monotonic() + timeout
    while True:
        got = conn.get_num_new_matched_tokens(req, num_computed_tokens)
        if got[0] is not None or time.monotonic() > end:
            return got  # type: ignore[no-any-return]
        time.sleep(0.001)


def pull_plan(reusable: int, source: str = "d-1", rid: str = "d-req-1") -> opb.PlanTurnResponse:
    params = {"do_remote_decode": True, "do_remote_prefill": False, "remote_block_ids": [[0, 1, 2]],
              "remote_engine_id": source, "remote_request_id": rid, "remote_host": "127.0.0.1",
              "remote_port": 5600, "tp_size": 1, "dcp_size": 1, "pp_size": 1, "remote_num_tokens": reusable,
              "remote_registration_generation": 1, "transfer_mode": "pull"}
    return opb.PlanTurnResponse(plan_id="plan-1", decision=opb.PLAN_DECISION_PULL, reason=opb.PLAN_REASON_VERIFIED_PREFIX,
                                reusable_tokens=reusable, kv_transfer_params_json=json.dumps(params))


def prefill_request(rid: str = "p-req-1", conversation: str = "c-1", tokens: int = 100) -> Request:
    return Request(rid, list(range(tokens)), {**FIRST_TURN, "boomerang": {"conversation_id": conversation}})


def test_worker_role_gets_no_hook(connector: Any) -> None:
    conn = connector("p-1", extra("prefill"), KVConnectorRole.WORKER)
    assert conn.boomerang is None
    assert conn.get_num_new_matched_tokens(prefill_request(), 0) == (0, False)


def test_bad_configuration_stops_the_engine(connector: Any) -> None:
    with pytest.raises(HookConfigError, match="boomerang.plan_deadline_ms"):
        connector("p-1", extra("prefill", plan_deadline_ms=0))


def test_prefill_pull_turn(connector: Any, fakes: Fakes) -> None:
    fakes.router.planner = lambda req: pull_plan(96)
    conn = connector("p-1", extra("prefill"))
    req = prefill_request()
    # 96 verified tokens, 16 of them already in P's own prefix cache.
    assert matched(conn, req, 16) == (80, True)
    params = req.kv_transfer_params
    assert params["remote_engine_id"] == "d-1" and params["remote_num_tokens"] == 96
    assert params["boomerang"] == {"conversation_id": "c-1"}  # the request's own keys stay
    # vLLM asks again while the request waits for blocks: no second plan.
    assert matched(conn, req, 16) == (80, True)
    assert len(fakes.router.plans) == 1
    # The plan is made for this engine and what its own prefix cache holds.
    assert (fakes.router.plans[0].prefill_engine_id, fakes.router.plans[0].prefill_cached_tokens) == ("p-1", 16)
    conn.update_state_after_alloc(req, None, 80)
    assert conn.pulls == [("p-req-1", "d-req-1", 80)]
    time.sleep(0.01)  # the copy
    conn.update_connector_output(type("Output", (), {"finished_recving": {"p-req-1"}, "finished_sending": None})())
    time.sleep(0.01)  # the prefill of the rest
    req.status = "FINISHED_LENGTH_CAPPED"
    delay_free, out = conn.request_finished_all_groups(req, block_ids_for(100, 16))
    assert delay_free and out["do_remote_prefill"] is True
    assert out["boomerang"] == {"tenant": "acme", "conversation_id": "c-1"}  # travels to D with P's params
    assert wait_for(lambda: len(fakes.background.reports) == 1, 5)
    report = fakes.background.reports[0]
    assert (report.tenant, report.plan_id, report.handle_use) == ("acme", "plan-1", opb.HANDLE_USE_READ)
    # The delivered reuse, by the hook's own count: 16 from P's prefix cache + 80 pulled.
    assert report.HasField("delivered_cached_tokens") and report.delivered_cached_tokens == 96
    # The measured times the router learns from: allocation to finish, and of that the copy.
    assert report.HasField("prefill_seconds") and report.HasField("copy_seconds")
    assert 0.01 <= report.copy_seconds < report.prefill_seconds < 5
    stats = conn.boomerang.stats()
    assert stats["plan_pull"] == 1 and stats["reused_tokens"] == 96 and "plan_ms_p99" in stats


def test_pull_never_allocated_is_reported_unknown(connector: Any, fakes: Fakes) -> None:
    fakes.router.planner = lambda req: pull_plan(96)
    conn = connector("p-1", extra("prefill"))
    req = prefill_request()
    matched(conn, req, 0)
    req.status = "FINISHED_ABORTED"
    assert conn.request_finished_all_groups(req, block_ids_for(100, 16)) == (False, None)
    assert wait_for(lambda: len(fakes.background.reports) == 1, 5)
    assert fakes.background.reports[0].handle_use == opb.HANDLE_USE_UNKNOWN
    assert not fakes.background.reports[0].HasField("delivered_cached_tokens")  # never allocated: no count


def test_unusable_pull_params_give_the_claim_back(connector: Any, fakes: Fakes) -> None:
    fakes.router.planner = lambda req: opb.PlanTurnResponse(plan_id="plan-9", decision=opb.PLAN_DECISION_PULL,
                                                            kv_transfer_params_json="{not json")
    conn = connector("p-1", extra("prefill"))
    req = prefill_request()
    before = dict(req.kv_transfer_params or {})
    assert matched(conn, req, 0) == (0, False)
    assert req.kv_transfer_params == before
    conn.update_state_after_alloc(req, None, 0)
    req.status = "FINISHED_STOPPED"
    conn.request_finished_all_groups(req, block_ids_for(100, 16))
    assert wait_for(lambda: len(fakes.background.reports) == 1, 5)
    assert fakes.background.reports[0].handle_use == opb.HANDLE_USE_NOT_READ
    assert conn.boomerang.stats()["bad_plan_params"] == 1


def test_cold_plan_leaves_the_request_alone(connector: Any, fakes: Fakes) -> None:
    conn = connector("p-1", extra("prefill"))
    req = prefill_request()
    before = dict(req.kv_transfer_params or {})
    assert matched(conn, req, 0) == (0, False)
    assert req.kv_transfer_params == before
    req.status = "FINISHED_STOPPED"
    conn.request_finished_all_groups(req, block_ids_for(100, 16))
    assert wait_for(lambda: len(fakes.background.reports) == 1, 5)
    assert fakes.background.reports[0].handle_use == opb.HANDLE_USE_UNSPECIFIED


def test_requests_the_hook_leaves_to_vllm(connector: Any, fakes: Fakes) -> None:
    conn = connector("p-1", extra("prefill"))
    given = {**json.loads(pull_plan(96).kv_transfer_params_json), "boomerang": {"conversation_id": "c-1"}}
    assert conn.get_num_new_matched_tokens(Request("b", list(range(100)), given), 0) == (96, True)
    foreign = Request("c", list(range(100)), {"boomerang": {"conversation_id": "c", "tenant": "other"}})
    matched(conn, foreign, 0)
    assert fakes.router.plans == []
    stats = conn.boomerang.stats()
    assert (stats["handle_given"], stats["foreign_tenant"]) == (1, 1)


def test_a_request_without_a_conversation_is_planned_by_its_tokens(connector: Any, fakes: Fakes) -> None:
    conn = connector("p-1", extra("prefill", plan_with="chain"))
    request = Request("a", list(range(100)), dict(FIRST_TURN))
    request.cache_salt = "s-1"  # type: ignore[attr-defined]
    assert matched(conn, request, 0) == (0, False)
    (plan,) = fakes.router.plans
    assert (plan.tenant, plan.conversation_id, plan.cache_salt) == ("acme", "", "s-1")
    assert list(plan.prompt_token_ids) == list(range(100))  # the router proves the continuation with them


def test_router_failure_computes_locally(connector: Any, fakes: Fakes) -> None:
    fakes.router.errors.append(client_error("PlanTurn", "UNAVAILABLE"))
    conn = connector("p-1", extra("prefill"))
    req = prefill_request()
    assert matched(conn, req, 0) == (0, False)
    assert "remote_engine_id" in req.kv_transfer_params and req.kv_transfer_params["remote_engine_id"] is None
    assert conn.boomerang.stats()["fallback_unavailable"] == 1


def test_timed_out_plan_is_found_and_given_back(connector: Any, fakes: Fakes) -> None:
    fakes.router.delay = 1.0  # the scheduler's call gives up at the deadline
    fakes.background.planner = lambda req: pull_plan(96)  # ... but the router did claim a lease
    conn = connector("p-1", extra("prefill", plan_deadline_ms=300))  # long enough for the call to leave
    req = prefill_request()
    assert matched(conn, req, 0) == (0, False)
    assert wait_for(lambda: len(fakes.background.reports) == 1, 5)
    assert fakes.background.plans[0].request_id == fakes.router.plans[0].request_id
    report = fakes.background.reports[0]
    assert (report.plan_id, report.handle_use) == ("plan-1", opb.HANDLE_USE_NOT_READ)


def test_decode_registers_what_it_holds(connector: Any, fakes: Fakes) -> None:
    conn = connector("d-1", extra("decode"))
    prompt, output = list(range(500, 570)), list(range(900, 925))
    req = Request("d-req-1", prompt, {"do_remote_prefill": True, "boomerang": {"conversation_id": "c-1", "tenant": "acme"}},
                  output_token_ids=output, status="FINISHED_STOPPED")
    delay_free, params = conn.request_finished_all_groups(req, block_ids_for(95, 16, start=40))
    assert delay_free and params["do_remote_decode"] is True and "boomerang" not in params
    assert wait_for(lambda: conn.boomerang.sender.registered == 1, 5)
    assert [name for name, _ in fakes.registry.calls if name.startswith("RegisterRetained")] == ["RegisterRetainedBlocksBatch"]
    (sent,) = fakes.registry.registrations
    # D holds KV for every token but the last one sampled (vLLM's remote_num_tokens is the
    # request's num_computed_tokens), and the lease covers exactly that.
    chain = build_chain((prompt + output)[:94], 16)
    assert sent.num_tokens == 94 and sent.token_chain.block_hashes == chain.block_hashes
    assert sent.token_chain.tail_hash == chain.tail_hash
    assert (sent.engine_id, sent.engine_generation, sent.remote_request_id) == ("d-1", 1, "d-req-1")
    assert [list(g.block_ids) for g in sent.block_groups] == [list(range(40, 46))]
    assert (sent.remote_host, sent.remote_port, sent.model) == ("127.0.0.1", 5600, "qwen3-32b")
    engine = next(r for name, r in fakes.registry.calls if name == "RegisterEngine").engine
    assert (engine.engine_id, engine.side_channel_host, engine.side_channel_port, engine.block_size) == ("d-1", "127.0.0.1", 5600, 16)


def test_decode_skips_aborts_and_registers_unnamed_conversations(connector: Any, fakes: Fakes) -> None:
    conn = connector("d-1", extra("decode"))
    aborted = Request("a", list(range(40)), {"boomerang": {"conversation_id": "c"}}, status="FINISHED_ABORTED")
    assert conn.request_finished_all_groups(aborted, block_ids_for(40, 16)) == (False, None)
    anonymous = Request("b", list(range(40)), {"do_remote_prefill": True}, status="FINISHED_STOPPED")
    assert conn.request_finished_all_groups(anonymous, block_ids_for(40, 16))[0] is True
    stats = conn.boomerang.stats()
    assert stats["finished_without_handle"] == 1 and stats.get("no_conversation", 0) == 0
    assert stats["sender"]["offered"] == 1  # found later by the prompt that continues it


def test_hook_errors_never_reach_vllm(connector: Any, fakes: Fakes, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = connector("p-1", extra("prefill"))

    def boom(*args: Any) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(conn.boomerang, "before_match", boom)
    monkeypatch.setattr(conn.boomerang, "on_finished", boom)
    req = prefill_request()
    assert matched(conn, req, 0) == (0, False)
    req.status = "FINISHED_STOPPED"
    assert conn.request_finished_all_groups(req, block_ids_for(100, 16))[1]["do_remote_prefill"] is True
    assert conn.boomerang.counters["hook_errors"] == 2


def test_load_for_heartbeats(connector: Any) -> None:
    conn = connector("p-1", extra("prefill"))
    a, b = prefill_request("a", tokens=100), prefill_request("b", tokens=40)
    matched(conn, a, 0)
    matched(conn, b, 0)
    conn.update_state_after_alloc(a, None, 0)
    assert conn.boomerang.load() == (2, 40)


def test_a_slow_plan_never_holds_the_scheduler(connector: Any, fakes: Fakes) -> None:
    # The router answers once the scheduler has asked ten times: a call that waited for the
    # plan would wait its whole 1 s, so the bound below needs no tight margin.
    release = threading.Event()
    fakes.router.planner = lambda req: pull_plan(96) if release.wait(5) else opb.PlanTurnResponse()
    fakes.router.delay = 0.001  # answered on a thread of its own
    conn = connector("p-1", extra("prefill"))
    req = prefill_request()
    calls, answer = [], None
    while answer is None:
        started = time.perf_counter()
        answer = conn.get_num_new_matched_tokens(req, 0)[0]
        calls.append(time.perf_counter() - started)
        if len(calls) == 10:
            release.set()
        time.sleep(0.005)
    # Every call came back at once; the ones while the plan was in flight said "ask again later".
    assert len(calls) > 10 and max(calls) < 0.5, (len(calls), max(calls))
    assert answer == 96 and req.kv_transfer_params["remote_engine_id"] == "d-1"
    assert conn.boomerang.stats()["plan_waits"] >= 10 and len(fakes.router.plans) == 1


def test_a_request_that_ends_with_its_plan_in_flight_gives_the_claim_back(connector: Any, fakes: Fakes) -> None:
    release = threading.Event()  # the router answers only after the request ended
    fakes.router.planner = lambda req: pull_plan(96) if release.wait(5) else opb.PlanTurnResponse()
    fakes.router.delay = 0.001
    conn = connector("p-1", extra("prefill"))
    req = prefill_request()
    assert conn.get_num_new_matched_tokens(req, 0) == (None, False)
    assert wait_for(lambda: len(fakes.router.plans) == 1, 5)  # the router is claiming
    req.status = "FINISHED_ABORTED"  # the client went away while the plan was in flight
    assert conn.request_finished_all_groups(req, block_ids_for(100, 16)) == (False, None)
    assert conn.boomerang.load() == (0, 0)  # nothing of the request is kept
    release.set()
    assert wait_for(lambda: len(fakes.background.reports) == 1, 5)
    report = fakes.background.reports[0]
    assert (report.plan_id, report.handle_use) == ("plan-1", opb.HANDLE_USE_NOT_READ)  # vLLM never saw it
    assert wait_for(lambda: conn.boomerang.stats().get("late_given_back") == 1, 5)
    assert conn.boomerang.stats()["plans_in_flight"] == 0


def test_a_plan_that_comes_after_the_wait_gives_the_claim_back(connector: Any, fakes: Fakes) -> None:
    release = threading.Event()  # the router answers only after the scheduler gave up
    fakes.router.planner = lambda req: pull_plan(96) if release.wait(5) else opb.PlanTurnResponse()
    fakes.router.delay = 0.001
    fakes.background.planner = lambda req: pull_plan(96)  # asked again, the router names its claim
    # 100 tokens at 12 ms with a quarter share: the request waits 0.3 s (not the 1 s deadline),
    # then computes locally.
    conn = connector("p-1", extra("prefill", plan_deadline_ms=1000, prefill_ms_per_token=12.0))
    req = prefill_request()
    started = time.monotonic()
    assert matched(conn, req, 0) == (0, False)
    assert 0.3 <= time.monotonic() - started < 0.9
    release.set()
    stats = conn.boomerang.stats()
    # Given up by the scheduler, or by gRPC at the same deadline: either way, computed locally.
    assert stats.get("fallback_wait_over", 0) + stats.get("fallback_deadline_exceeded", 0) == 1, stats
    assert "remote_engine_id" not in req.kv_transfer_params or req.kv_transfer_params["remote_engine_id"] is None
    assert wait_for(lambda: len(fakes.background.reports) == 1, 5)
    assert fakes.background.reports[0].handle_use == opb.HANDLE_USE_NOT_READ


def test_requests_that_cannot_gain_are_never_held_back(connector: Any, fakes: Fakes) -> None:
    conn = connector("p-1", extra("prefill", prefill_ms_per_token=0.001))
    # 100 tokens at 1 µs each could save 0.1 ms: not worth one round trip.
    assert conn.get_num_new_matched_tokens(prefill_request("a"), 0) == (0, False)
    conn = connector("p-2", extra("prefill"))
    # 80 tokens, 32 of them in P's own cache: 48 to compute, below the recompute threshold (64).
    assert conn.get_num_new_matched_tokens(prefill_request("b", tokens=80), 32) == (0, False)
    assert fakes.router.plans == []
    assert conn.boomerang.stats()["no_plan_below_threshold"] == 1
