"""The kv_transfer_params the router emits, checked against vLLM's wire contract
(docs/vllm-contract.md)."""

from __future__ import annotations

import json

import pytest
from boomerang.errors import BoomerangError
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang.v1 import types_pb2 as tpb
from boomerang_router import domain, rpc_surface
from boomerang_router.domain import ClaimResult, LeaseHandle, PlanDecision, decide
from boomerang_server.leases import ClaimOutcome

BS = 16
THRESHOLD = 64


def lease(num_tokens: int = 330, groups: int = 1) -> LeaseHandle:
    blocks = -(-num_tokens // BS)
    return LeaseHandle(
        lease_id="4c0e5a04-5d0e-4c1f-9a43-3c6f1d1c2b11",
        claim_id="claim-1",
        engine_id="decode-engine-7",
        engine_generation=5,
        remote_request_id="cmpl-abc-0",
        block_groups=tuple(tuple(range(1000 * g, 1000 * g + blocks)) for g in range(groups)),
        num_tokens=num_tokens,
        block_size=BS,
        remote_host="10.1.2.3",
        remote_port=5601,
        tp_size=4,
        dcp_size=2,
        pp_size=1,
    )


def prefill_accepts(params: dict) -> bool:  # type: ignore[type-arg]
    """P's rule, written from docs/vllm-contract.md independently of the code under test."""
    return (
        params.get("do_remote_decode") is True
        and bool(params.get("remote_block_ids"))
        and all(params.get(k) is not None for k in ("remote_engine_id", "remote_request_id", "remote_host", "remote_port"))
    )


def test_first_turn_form_is_exactly_the_proxys() -> None:
    expected = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    text = domain.params_json(domain.first_turn_params())
    assert json.loads(text) == expected
    assert not prefill_accepts(json.loads(text))  # P computes the whole prompt


@pytest.mark.parametrize("prompt_tokens", [100, 330, 331, 400, 5000])
def test_pull_params_satisfy_the_prefill_acceptance_rule_field_by_field(prompt_tokens: int) -> None:
    held = lease(num_tokens=330, groups=2)
    verified = min(320 if prompt_tokens != 330 else 330, prompt_tokens)
    d = decide(ClaimResult(ClaimOutcome.CLAIMED, held, verified, 200.0), prompt_tokens, BS, THRESHOLD)
    assert d.decision is PlanDecision.PULL
    params = json.loads(domain.params_json(domain.pull_params(held, d.reusable_tokens)))

    # Every field P needs, with the type and value vLLM expects.
    assert params["do_remote_decode"] is True
    assert params["do_remote_prefill"] is False
    assert params["remote_engine_id"] == "decode-engine-7"
    assert params["remote_request_id"] == "cmpl-abc-0"
    assert params["remote_host"] == "10.1.2.3"
    assert params["remote_port"] == 5601 and isinstance(params["remote_port"], int)
    assert (params["tp_size"], params["dcp_size"], params["pp_size"]) == (4, 2, 1)
    assert params["transfer_mode"] == "pull"
    assert params["remote_registration_generation"] == 5
    assert "remote_blocks_expiry_time" not in params  # D's clock is unknowable here
    groups = params["remote_block_ids"]
    assert isinstance(groups, list) and len(groups) == 2 and all(isinstance(g, list) for g in groups)
    assert prefill_accepts(params)

    # remote_num_tokens: the verified prefix in whole blocks, below the prompt, and what P
    # ends up loading (min(remote_num_tokens, prompt) − its own cache) is at least the threshold.
    n = params["remote_num_tokens"]
    assert n == d.reusable_tokens
    assert n % BS == 0 and n <= verified and n < prompt_tokens
    loads = min(n, prompt_tokens) - 0
    assert loads >= THRESHOLD
    # The block ids cover exactly the tokens to load, in order, per group.
    assert groups == [list(range(1000 * g, 1000 * g + n // BS)) for g in range(2)]


def test_params_as_json_and_typed_agree() -> None:
    p = domain.pull_params(lease(), 320)
    typed = rpc_surface.params_proto(p)
    assert rpc_surface.params_from_proto(typed) == p
    assert domain.params_from_json(domain.params_json(p)) == p
    first = rpc_surface.params_proto(domain.first_turn_params())
    assert first.do_remote_decode and not first.HasField("remote_engine_id") and not first.remote_block_groups


def test_decode_handle_parses_vllms_forms() -> None:
    d = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_block_ids": [1, 2, 3],  # older vLLM: one flat list
        "remote_engine_id": "d",
        "remote_request_id": "r",
        "remote_host": "h",
        "remote_port": 1,
        "remote_num_tokens": 40,
        "remote_blocks_expiry_time": 12345.5,
        "something_new": {"x": 1},
    }
    p = domain.params_from_dict(d)
    assert p.remote_block_ids == ((1, 2, 3),) and p.remote_blocks_expiry_time == 12345.5
    assert domain.accepts_pull(p)
    assert domain.params_dict(p)["something_new"] == {"x": 1}
    assert domain.params_from_json("null") is None and domain.params_from_json("  ") is None


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{", "valid JSON"),
        ("[1]", "JSON object"),
        ('{"do_remote_decode": "yes"}', "do_remote_decode"),
        ('{"remote_port": "80"}', "remote_port"),
        ('{"remote_port": true}', "remote_port"),
        ('{"remote_block_ids": [[1], "x"]}', "remote_block_ids"),
        ('{"remote_engine_id": 7}', "remote_engine_id"),
        ('{"remote_blocks_expiry_time": "soon"}', "remote_blocks_expiry_time"),
    ],
)
def test_bad_decode_handles_name_the_key(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        domain.params_from_json(text)


def test_acceptance_needs_every_required_field() -> None:
    full = domain.params_dict(domain.pull_params(lease(), 320))
    assert prefill_accepts(full) and domain.accepts_pull(domain.params_from_dict(full))
    for key in ("remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host", "remote_port"):
        broken = {**full, key: None}
        assert not domain.accepts_pull(domain.params_from_dict(broken)), key
    assert not domain.accepts_pull(domain.params_from_dict({**full, "do_remote_decode": False}))
    assert not domain.accepts_pull(domain.params_from_dict({**full, "remote_block_ids": [[]]}))


def test_report_validation_names_bad_handle_fields() -> None:
    req = rtpb.ReportTurnRequest(
        tenant="t",
        plan_id="01900000-0000-7000-8000-000000000000",
        decode_kv_transfer_params_json=json.dumps(
            {"do_remote_decode": True, "remote_block_ids": [[1]], "remote_engine_id": "d", "remote_port": 0}
        ),
    )
    with pytest.raises(BoomerangError) as err:
        rpc_surface.report_turn(req, 10_000)
    fields = {v.field for v in err.value.violations}
    assert {
        "decode_kv_transfer_params_json.remote_request_id",
        "decode_kv_transfer_params_json.remote_host",
        "decode_kv_transfer_params_json.remote_port",
        "decode_kv_transfer_params_json.remote_num_tokens",
        "prompt_token_ids",
    } <= fields
    typed = rtpb.ReportTurnRequest(
        tenant="t",
        plan_id="01900000-0000-7000-8000-000000000000",
        decode_kv_transfer_params=tpb.KvTransferParams(do_remote_decode=True),
    )
    ok = rpc_surface.report_turn(typed, 10_000)
    assert ok.decode_params is not None and not domain.accepts_pull(ok.decode_params)
