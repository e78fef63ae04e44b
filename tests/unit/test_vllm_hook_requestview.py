"""Reading conversations and handles from vLLM requests and `kv_transfer_params`."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from boomerang_vllm_hook.requestview import (
    Skip,
    TurnContext,
    block_groups,
    has_pull_handle,
    retained_handle,
    salt_tenant,
    turn_context,
)

from tests.support.vllm_standin import Request

FIRST_TURN = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def req(params: Any = None, xargs: Any = None) -> Request:
    return Request("r1", [1, 2, 3], params, sampling_params=SimpleNamespace(extra_args=xargs))


def test_context_from_kv_transfer_params() -> None:
    r = req({**FIRST_TURN, "boomerang": {"conversation_id": "c-1"}})
    assert turn_context(r, "acme", False) == TurnContext("acme", "c-1")
    r = req({"boomerang": {"conversation_id": "c-1", "tenant": "acme"}})
    assert turn_context(r, "acme", False) == TurnContext("acme", "c-1")


def test_context_from_vllm_xargs() -> None:
    r = req(None, {"boomerang_conversation_id": "c-2", "boomerang_tenant": "beta"})
    assert turn_context(r, "", True) == TurnContext("beta", "c-2")


def test_no_conversation_is_still_a_turn_of_the_tenant() -> None:
    # Found by the prompt it continues (issue 23): the engine's tenant, no conversation id.
    for params in (None, FIRST_TURN, {"boomerang": {"conversation_id": ""}}):
        found = turn_context(req(params), "acme", False)
        assert found == TurnContext("acme", "") and isinstance(found, TurnContext) and found.prompt_tokens == 3
    assert turn_context(req(None), "", True) is Skip.NO_CONVERSATION  # nothing names whose turn it is


def test_cache_salt_seeds_the_context_and_names_a_tenant_when_none_is_configured() -> None:
    r = req(None)
    r.cache_salt = "user-7"  # type: ignore[attr-defined]
    assert turn_context(r, "acme", False) == TurnContext("acme", "", "user-7")
    found = turn_context(r, "", True)
    assert isinstance(found, TurnContext) and found.tenant == salt_tenant("user-7") and found.salt == "user-7"
    assert salt_tenant("user-7") != salt_tenant("user-8")


def test_long_salts_stay_apart_by_their_digest() -> None:
    # vLLM bounds no salt; two long ones must never pool into one (once they became "").
    contexts = []
    for salt in ("a" * 300, "a" * 299 + "b"):
        r = req(None)
        r.cache_salt = salt  # type: ignore[attr-defined]
        found = turn_context(r, "acme", False)
        assert isinstance(found, TurnContext) and found.salt.startswith("sha256:")
        contexts.append(found)
    assert contexts[0].salt != contexts[1].salt


def test_foreign_tenant_is_refused_not_remapped() -> None:
    r = req({"boomerang": {"conversation_id": "c", "tenant": "other"}})
    assert turn_context(r, "acme", False) is Skip.FOREIGN_TENANT
    assert turn_context(r, "acme", True) == TurnContext("other", "c")


def test_bad_context() -> None:
    for ctx in ({"conversation_id": 7}, {"conversation_id": "x" * 257}, {"conversation_id": "a\nb"}, {"conversation_id": "c", "tenant": 5}):
        assert turn_context(req({"boomerang": ctx}), "acme", False) is Skip.BAD_CONTEXT, ctx
    # A trusting engine without a default tenant, and a request that names none.
    assert turn_context(req({"boomerang": {"conversation_id": "c"}}), "", True) is Skip.BAD_CONTEXT


def test_pull_handle_rule() -> None:
    handle = {**FIRST_TURN, "remote_engine_id": "d", "remote_block_ids": [[1]], "remote_request_id": "x",
              "remote_host": "h", "remote_port": 1}
    assert has_pull_handle(handle)
    assert not has_pull_handle(FIRST_TURN)
    assert not has_pull_handle({**handle, "remote_host": None})
    assert not has_pull_handle({**handle, "do_remote_decode": False})
    assert not has_pull_handle(None)


def test_retained_handle_parsing() -> None:
    d = {"do_remote_decode": True, "do_remote_prefill": False, "remote_block_ids": [[4, 5], [9, 10]],
         "remote_engine_id": "d1", "remote_request_id": "rq", "remote_host": "10.0.0.2", "remote_port": 5600,
         "tp_size": 2, "remote_num_tokens": 20, "remote_blocks_expiry_time": 123.5,
         "remote_registration_generation": 3, "transfer_mode": "pull"}
    h = retained_handle(d)
    assert h is not None
    assert (h.engine_id, h.remote_request_id, h.block_groups) == ("d1", "rq", ((4, 5), (9, 10)))
    assert (h.num_tokens, h.expiry_time, h.generation, h.remote_port) == (20, 123.5, 3, 5600)
    # P's params for D, an abort, and junk are not D's handle.
    assert retained_handle({**d, "do_remote_decode": False, "do_remote_prefill": True}) is None
    assert retained_handle(None) is None
    assert retained_handle({**d, "remote_block_ids": []}) is None
    assert retained_handle({**d, "remote_engine_id": None}) is None
    assert retained_handle({**d, "remote_blocks_expiry_time": float("nan")}).expiry_time is None  # type: ignore[union-attr]


def test_block_groups_forms() -> None:
    assert block_groups([1, 2]) == ((1, 2),)  # older vLLM: one flat list
    assert block_groups([[1], [2, 3]]) == ((1,), (2, 3))
    assert block_groups([[1], []]) is None and block_groups([True]) is None and block_groups("1") is None
