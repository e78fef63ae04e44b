"""A turn's reuse outcome: planned vs delivered, why a reuse was declined, and what the client's
`usage.prompt_tokens_details.cached_tokens` says."""

from __future__ import annotations

import json

from boomerang_gateway import protocol
from boomerang_gateway.chunks import Aggregate, Capture, for_client
from boomerang_gateway.control import (
    PREFILL_SHORTFALL,
    delivered_by_prefill,
    prompt_tokens_of,
    reuse_outcome,
)
from boomerang_gateway.protocol import Kind


def test_delivered_is_the_prefill_engines_own_count() -> None:
    # vLLM with --enable-prompt-tokens-details: the usage says it.
    assert delivered_by_prefill({"usage": {"prompt_tokens_details": {"cached_tokens": 96}}}) == 96
    # vLLM 0.33.0 without it: the scheduler's remote_prefill_cached_tokens in P's params.
    body = {"usage": {"prompt_tokens": 120, "prompt_tokens_details": None},
            "kv_transfer_params": {"do_remote_prefill": True, "remote_prefill_cached_tokens": 80}}
    assert delivered_by_prefill(body) == 80
    # The usage wins when both are given (it is the engine's answer to the client).
    both = {"usage": {"prompt_tokens_details": {"cached_tokens": 5}}, "kv_transfer_params": {"remote_prefill_cached_tokens": 80}}
    assert delivered_by_prefill(both) == 5
    for silent in (None, [], {}, {"usage": None, "kv_transfer_params": None},
                   {"kv_transfer_params": {"remote_prefill_cached_tokens": -1}},
                   {"kv_transfer_params": {"remote_prefill_cached_tokens": True}},
                   {"usage": {"prompt_tokens_details": {"cached_tokens": "7"}}}):
        assert delivered_by_prefill(silent) is None, silent
    assert prompt_tokens_of(body) == 120 and prompt_tokens_of({}) == 0


def test_a_pull_delivered_in_full_is_not_declined() -> None:
    out = reuse_outcome("PULL", "VERIFIED_PREFIX", 200, 160, 160)
    assert out.declined == "" and out.cached_tokens == 160
    # P's own prefix cache may serve more than the pull: still not declined, and counted.
    more = reuse_outcome("PULL", "VERIFIED_PREFIX", 200, 160, 176)
    assert more.declined == "" and more.cached_tokens == 176


def test_a_pull_the_prefill_engine_cut_short_is_a_shortfall() -> None:
    out = reuse_outcome("PULL", "VERIFIED_PREFIX", 200, 160, 0)
    assert out.declined == PREFILL_SHORTFALL and out.cached_tokens == 0
    assert reuse_outcome("PULL", "VERIFIED_PREFIX", 200, 160, 159).declined == PREFILL_SHORTFALL


def test_unreported_delivery_falls_back_to_the_plan() -> None:
    out = reuse_outcome("PULL", "VERIFIED_PREFIX", 200, 160, None)
    assert out.delivered is None and out.cached_tokens == 160 and out.declined == ""


def test_turns_that_reuse_nothing_are_declined_for_the_plans_reason() -> None:
    assert reuse_outcome("COLD", "NO_LEASE", 50, 0, 0).declined == "NO_LEASE"
    assert reuse_outcome("RECOMPUTE", "PREFIX_MISMATCH", 50, 0, 0).declined == "PREFIX_MISMATCH"
    # Gateway-side causes are reasons too.
    assert reuse_outcome("RECOMPUTE", "PREFILL_RETRY", 50, 32, None).declined == "PREFILL_RETRY"
    assert reuse_outcome("COLD", "REUSE_OFF", 50, 0, None).cached_tokens == 0
    assert reuse_outcome("COLD", "", 50, 0, None).declined == "UNSPECIFIED"


def test_turns_the_engines_hook_planned_are_judged_by_the_prefill_engines_count() -> None:
    assert reuse_outcome("ENGINE", "ENGINE_HOOK", 0, 0, 96).declined == ""
    assert reuse_outcome("ENGINE", "ENGINE_HOOK", 0, 0, 96).cached_tokens == 96
    assert reuse_outcome("ENGINE", "ENGINE_HOOK", 0, 0, 0).declined == "ENGINE_HOOK"
    assert reuse_outcome("ENGINE", "ENGINE_HOOK", 0, 0, None).declined == ""  # unknown: counted as unreported


def _req(**extra: object) -> protocol.ClientRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], **extra}
    return protocol.parse(Kind.CHAT, json.dumps(body).encode(), None)


def test_cached_tokens_reach_the_clients_usage_streamed_and_not() -> None:
    usage = {"prompt_tokens": 30, "completion_tokens": 2, "total_tokens": 32, "prompt_tokens_details": None}
    chunk = {"id": "c", "choices": [], "usage": usage}
    out = for_client(chunk, _req(stream=True, stream_options={"include_usage": True}), 24)
    assert out is not None and out["usage"]["prompt_tokens_details"] == {"cached_tokens": 24}
    assert usage["prompt_tokens_details"] is None  # D's chunk is not modified in place
    # D's own figure (if it reports one) is replaced; its other details stay.
    d_usage = {**usage, "prompt_tokens_details": {"cached_tokens": 30, "multimodal_tokens": None}}
    out = for_client({"id": "c", "choices": [], "usage": d_usage}, _req(stream=True, stream_options={"include_usage": True}), 0)
    assert out is not None and out["usage"]["prompt_tokens_details"] == {"cached_tokens": 0, "multimodal_tokens": None}
    capture = Capture()
    folded = Aggregate(_req(), capture)
    for each in ({"id": "c", "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}, chunk):
        capture.observe(each)
        folded.add(each)
    assert folded.result(24)["usage"]["prompt_tokens_details"] == {"cached_tokens": 24}
