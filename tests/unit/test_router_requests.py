"""Router request validation: every bad field is named, good requests become domain values."""

from __future__ import annotations

import pytest
from boomerang.errors import BoomerangError, Code
from boomerang.tokenchain import build_chain
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import types_pb2 as tpb
from boomerang_router import rpc_surface
from boomerang_router.domain import HandleUse
from boomerang_router.plan_store import new_plan_id


def violations(fn, *args) -> set[str]:  # type: ignore[no-untyped-def]
    with pytest.raises(BoomerangError) as err:
        fn(*args)
    assert err.value.code is Code.INVALID_ARGUMENT
    return {v.field for v in err.value.violations}


def chain_msg(tokens: list[int], block_size: int = 16) -> tpb.TokenChain:
    c = build_chain(tokens, block_size)
    return tpb.TokenChain(block_size=c.block_size, num_tokens=c.num_tokens, block_hashes=c.block_hashes, tail_hash=c.tail_hash)


def test_plan_turn_reports_every_bad_field_at_once() -> None:
    bad = rtpb.PlanTurnRequest(tenant="has space", conversation_id="a\x00b", model="", request_id="x" * 200)
    assert violations(rpc_surface.plan_turn, bad, 1000) == {"tenant", "conversation_id", "model", "request_id", "prompt_token_ids"}


def test_plan_turn_takes_token_ids_or_a_chain_not_both() -> None:
    both = rtpb.PlanTurnRequest(tenant="t", model="m", prompt_token_ids=[1, 2], prompt_chain=chain_msg([1, 2]))
    assert violations(rpc_surface.plan_turn, both, 1000) == {"prompt_chain"}
    broken = rtpb.PlanTurnRequest(tenant="t", model="m", prompt_chain=tpb.TokenChain(block_size=16, num_tokens=40))
    assert violations(rpc_surface.plan_turn, broken, 1000) == {"prompt_chain"}
    mismatch = rtpb.PlanTurnRequest(tenant="t", model="m", prompt_token_ids=[1, 2, 3], num_prompt_tokens=4)
    assert violations(rpc_surface.plan_turn, mismatch, 1000) == {"num_prompt_tokens"}
    too_long = rtpb.PlanTurnRequest(tenant="t", model="m", prompt_token_ids=list(range(11)))
    assert violations(rpc_surface.plan_turn, too_long, 10) == {"prompt_token_ids"}


def test_plan_turn_good_requests() -> None:
    ids = rpc_surface.plan_turn(rtpb.PlanTurnRequest(tenant="t", model="m", prompt_token_ids=[5, 6, 7]), 1000)
    assert ids.token_ids == [5, 6, 7] and ids.prompt_tokens == 3 and ids.chain is None and ids.conversation_id == ""
    by_chain = rpc_surface.plan_turn(
        rtpb.PlanTurnRequest(tenant="t", conversation_id="c", model="m", prompt_chain=chain_msg(list(range(40)))), 1000
    )
    assert by_chain.chain is not None and by_chain.prompt_tokens == 40 and by_chain.token_ids is None


def test_report_turn_fields() -> None:
    bad = rtpb.ReportTurnRequest(tenant="", plan_id="not-a-uuid", handle_use=9, finish_time_unix=-1)
    assert violations(rpc_surface.report_turn, bad, 1000) == {"tenant", "plan_id", "handle_use", "finish_time_unix"}
    v4 = rtpb.ReportTurnRequest(tenant="t", plan_id="4c0e5a04-5d0e-4c1f-9a43-3c6f1d1c2b11")
    assert violations(rpc_surface.report_turn, v4, 1000) == {"plan_id"}
    both = rtpb.ReportTurnRequest(
        tenant="t",
        plan_id=new_plan_id(),
        decode_kv_transfer_params=tpb.KvTransferParams(do_remote_decode=True),
        decode_kv_transfer_params_json="{}",
    )
    assert violations(rpc_surface.report_turn, both, 1000) == {"decode_kv_transfer_params_json"}
    chain_too_long = rtpb.ReportTurnRequest(
        tenant="t",
        plan_id=new_plan_id(),
        decode_kv_transfer_params_json='{"do_remote_decode": true, "remote_block_ids": [[1,2,3]], "remote_engine_id": "d",'
        ' "remote_request_id": "r", "remote_host": "h", "remote_port": 5, "remote_num_tokens": 32}',
        sequence_chain=chain_msg(list(range(48))),
    )
    assert violations(rpc_surface.report_turn, chain_too_long, 1000) == {"sequence_chain.num_tokens"}


def test_report_turn_good_request_defaults_to_unknown_handle_use() -> None:
    pid = new_plan_id()
    r = rpc_surface.report_turn(rtpb.ReportTurnRequest(tenant="t", plan_id=pid, prompt_token_ids=[1], output_token_ids=[2, 3]), 10)
    assert r.handle_use is HandleUse.UNKNOWN and r.token_ids == [1, 2, 3] and r.decode_params is None
    assert r.created_at.year >= 2024


def test_get_plan_and_list_engines_validation() -> None:
    assert violations(rpc_surface.get_plan, rtpb.GetTurnPlanRequest(tenant="t", plan_id=""), ) == {"plan_id"}
    assert violations(rpc_surface.list_engines, rtpb.RouterServiceListEnginesRequest(role=7)) == {"role"}
    rpc_surface.list_engines(rtpb.RouterServiceListEnginesRequest(role=tpb.ENGINE_ROLE_DECODE, model="m"))


def test_plan_turn_prediction_inputs() -> None:
    ok = rpc_surface.plan_turn(rtpb.PlanTurnRequest(tenant="t", model="m", prompt_token_ids=[1] * 100, prefill_cached_tokens=64,
                                                 can_prefill_on_decode=True, prefill_engine_id="p-1"), 1000)
    assert (ok.prefill_cached, ok.can_prefill_on_decode, ok.prefill_engine_id) == (64, True, "p-1")
    for cached in (-1, 101):
        with pytest.raises(BoomerangError) as err:
            rpc_surface.plan_turn(rtpb.PlanTurnRequest(tenant="t", model="m", prompt_token_ids=[1] * 100,
                                                    prefill_cached_tokens=cached), 1000)
        assert [v.field for v in err.value.violations] == ["prefill_cached_tokens"]


def test_report_turn_measured_times() -> None:
    plan_id = new_plan_id()
    ok = rpc_surface.report_turn(rtpb.ReportTurnRequest(tenant="t", plan_id=plan_id, prefill_seconds=0.2, copy_seconds=0.05,
                                                     inter_token_seconds=0.03, decode_first_token_seconds=0.06), 1000)
    assert (ok.prefill_seconds, ok.copy_seconds, ok.inter_token_seconds, ok.decode_first_token_seconds) == (
        0.2, 0.05, 0.03, 0.06)
    unset = rpc_surface.report_turn(rtpb.ReportTurnRequest(tenant="t", plan_id=plan_id), 1000)
    assert (unset.prefill_seconds, unset.copy_seconds, unset.inter_token_seconds, unset.decode_first_token_seconds) == (
        None, None, None, None)
    bad = [
        ({"prefill_seconds": -1.0}, ["prefill_seconds"]),
        ({"prefill_seconds": float("nan")}, ["prefill_seconds"]),
        ({"inter_token_seconds": 601.0}, ["inter_token_seconds"]),
        ({"decode_first_token_seconds": -0.5}, ["decode_first_token_seconds"]),
        ({"copy_seconds": 0.1}, ["copy_seconds"]),  # without the prefill it is part of
        ({"prefill_seconds": 0.1, "copy_seconds": 0.2}, ["copy_seconds"]),  # more than it
    ]
    for fields, violated in bad:
        with pytest.raises(BoomerangError) as err:
            rpc_surface.report_turn(rtpb.ReportTurnRequest(tenant="t", plan_id=plan_id, **fields), 1000)
        assert err.value.code is Code.INVALID_ARGUMENT and [v.field for v in err.value.violations] == violated
