"""The gateway's request handling: validation, Boomerang's fields, the P and D bodies
(docs/vllm-contract.md)."""

from __future__ import annotations

import json

import pytest
from boomerang_gateway import protocol
from boomerang_gateway.control import FIRST_TURN, fallback
from boomerang_gateway.protocol import ApiError, Kind, engine_status, from_engine

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def parse(body: object, kind: Kind = Kind.CHAT, header: str | None = None, reuse: str | None = None) -> protocol.ClientRequest:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return protocol.parse(kind, raw, header, reuse)


def bad(body: object, kind: Kind = Kind.CHAT) -> ApiError:
    with pytest.raises(ApiError) as err:
        parse(body, kind)
    assert err.value.status == 400
    return err.value


def test_malformed_bodies_are_400_naming_the_field() -> None:
    assert "JSON" in bad(b"{not json").message
    assert "object" in bad([1, 2]).message
    assert bad({"messages": []}).param == "model"
    assert bad({"model": 3, "messages": [{"role": "user"}]}).param == "model"
    assert bad({"model": "m", "messages": []}).param == "messages"
    assert bad({"model": "m", "messages": ["hi"]}).param == "messages"
    assert bad({**CHAT, "stream": "yes"}).param == "stream"
    assert bad({**CHAT, "n": 2}).param == "n"
    assert bad({**CHAT, "stream_options": []}).param == "stream_options"
    assert bad({**CHAT, "conversation_id": 7}).param == "conversation_id"
    assert bad({**CHAT, "conversation_id": "x" * 257}).param == "conversation_id"
    assert bad({"model": "m"}, Kind.COMPLETION).param == "prompt"
    assert bad({"model": "m", "prompt": ["a", "b"]}, Kind.COMPLETION).param == "prompt"
    assert bad({"model": "m", "prompt": ""}, Kind.COMPLETION).param == "prompt"
    with pytest.raises(ApiError):
        parse(CHAT, reuse="maybe")


def test_conversation_id_from_body_or_header_and_never_forwarded() -> None:
    req = parse({**CHAT, "conversation_id": "c-1"}, header=" c-1 ")
    assert req.conversation_id == "c-1"  # the same id in the body and the header
    assert "conversation_id" not in req.body
    assert parse(CHAT, header=" c-2 ").conversation_id == "c-2"
    assert parse(CHAT).conversation_id == ""
    for body in (protocol.prefill_body(req, FIRST_TURN), protocol.decode_body(req, None), protocol.tokenize_body(req)):
        assert "conversation_id" not in body


def test_client_kv_transfer_params_are_always_dropped() -> None:
    evil = {"do_remote_decode": True, "remote_host": "10.9.9.9", "remote_port": 1, "remote_block_ids": [[1]]}
    req = parse({**CHAT, "kv_transfer_params": evil})
    assert req.dropped_kv_params and "kv_transfer_params" not in req.body
    assert protocol.prefill_body(req, dict(FIRST_TURN))["kv_transfer_params"] == FIRST_TURN
    assert "kv_transfer_params" not in protocol.decode_body(req, None)


def test_prefill_body_is_one_token_not_streamed_with_the_plans_params() -> None:
    req = parse({**CHAT, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 500,
                 "max_completion_tokens": 400, "min_tokens": 5, "temperature": 0.3})
    handle = {"do_remote_decode": True, "remote_block_ids": [[1, 2]], "remote_num_tokens": 32}
    body = protocol.prefill_body(req, handle)
    assert body["max_tokens"] == 1 and body["max_completion_tokens"] == 1
    assert body["stream"] is False and "stream_options" not in body and "min_tokens" not in body
    assert body["kv_transfer_params"] == handle and body["temperature"] == 0.3
    assert req.body["max_tokens"] == 500  # the client's request is untouched


def test_decode_body_streams_token_ids_and_usage_with_ps_params() -> None:
    req = parse({**CHAT, "max_tokens": 50})
    p_params = {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_block_ids": [[3]]}
    body = protocol.decode_body(req, p_params)
    assert body["stream"] is True and body["return_token_ids"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["kv_transfer_params"] == p_params and body["max_tokens"] == 50
    assert req.stream is False and not req.include_usage and not req.wants_token_ids


def test_remote_host_is_rewritten_to_the_address_the_gateway_reached_p_at() -> None:
    params = {"remote_host": "0.0.0.0", "remote_port": 5600, "do_remote_prefill": True}
    out = protocol.rewrite_remote_host(params, "http://localhost:8100")
    assert out == {**params, "remote_host": "localhost"} and params["remote_host"] == "0.0.0.0"
    assert protocol.rewrite_remote_host(params, "http://[::1]:8100")["remote_host"] == "::1"  # type: ignore[index]
    assert protocol.rewrite_remote_host(None, "http://h:1") is None
    assert protocol.rewrite_remote_host({"remote_host": None}, "http://h:1") == {"remote_host": None}


def test_tokenize_body_renders_like_the_engine() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    req = parse({**CHAT, "tools": tools, "chat_template_kwargs": {"enable_thinking": False}, "temperature": 1})
    body = protocol.tokenize_body(req)
    assert body == {"model": "m", "messages": CHAT["messages"], "add_generation_prompt": True, "tools": tools,
                    "chat_template_kwargs": {"enable_thinking": False}}
    comp = parse({"model": "m", "prompt": ["hello"]}, Kind.COMPLETION)
    assert protocol.tokenize_body(comp) == {"model": "m", "prompt": "hello"} and comp.prompt_token_ids is None
    ids = parse({"model": "m", "prompt": [[1, 2, 3]]}, Kind.COMPLETION)
    assert ids.prompt_token_ids == [1, 2, 3]


def test_reuse_off_header_and_fallback_plans() -> None:
    assert parse(CHAT, reuse="OFF").reuse is False and parse(CHAT).reuse is True
    assert fallback("c", "CONTROL_PLANE_DEGRADED").decision == "RECOMPUTE"
    cold = fallback("", "REUSE_OFF")
    assert cold.decision == "COLD" and cold.kv_transfer_params == FIRST_TURN and cold.reused_tokens == 0
    cold.kv_transfer_params["remote_host"] = "x"
    assert FIRST_TURN["remote_host"] is None  # every plan gets its own copy


def test_first_turn_form_is_exactly_vllms() -> None:
    assert FIRST_TURN == {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                          "remote_block_ids": None, "remote_host": None, "remote_port": None}


def test_engine_errors_keep_client_statuses_and_wrap_server_failures() -> None:
    assert engine_status(400) == 400 and engine_status(404) == 404 and engine_status(429) == 429
    assert engine_status(500) == 502 and engine_status(503) == 503 and engine_status(401) == 502
    vllm = json.dumps({"error": {"message": "too long", "type": "BadRequestError", "param": "messages", "code": 400}})
    err = from_engine("prefill", 400, vllm.encode())
    assert (err.status, err.message, err.param, err.code) == (400, "too long", "messages", "400")
    old = from_engine("decode", 500, json.dumps({"object": "error", "message": "boom"}).encode())
    assert old.status == 502 and "decode engine failed" in old.message and "boom" in old.message
    raw = from_engine("decode", 500, b"Internal Server Error")
    assert raw.body()["error"]["type"] == "upstream_error" and "Internal Server Error" in raw.message


def conversation(body: dict[str, object], conv_header: str | None = None, session: str | None = None) -> str:
    raw = json.dumps({**CHAT, **body}).encode()
    return protocol.parse(Kind.CHAT, raw, conv_header, None, session).conversation_id


def test_each_conversation_source_alone_names_the_conversation() -> None:
    assert conversation({"conversation_id": "a"}) == "a"
    assert conversation({}, conv_header="b") == "b"
    assert conversation({"prompt_cache_key": "c"}) == "c"
    assert conversation({}, session=" d ") == "d"
    assert conversation({"prompt_cache_key": ""}, session="") == ""  # empty is absent


def test_agreeing_sources_are_one_conversation_and_prompt_cache_key_is_forwarded() -> None:
    raw = json.dumps({**CHAT, "conversation_id": "k", "prompt_cache_key": "k"}).encode()
    req = protocol.parse(Kind.CHAT, raw, "k", None, "k")
    assert req.conversation_id == "k"
    # OpenAI's field goes to the engines (vLLM 0.33.0 allows and ignores extra fields);
    # Boomerang's own does not.
    assert req.body["prompt_cache_key"] == "k" and "conversation_id" not in req.body
    assert protocol.prefill_body(req, FIRST_TURN)["prompt_cache_key"] == "k"


@pytest.mark.parametrize(
    ("body", "conv_header", "session", "first", "second"),
    [
        ({"conversation_id": "a"}, "b", None, "conversation_id", "X-Conversation-Id"),
        ({"conversation_id": "a", "prompt_cache_key": "b"}, None, None, "conversation_id", "prompt_cache_key"),
        ({}, "a", "b", "X-Conversation-Id", "X-Session-Id"),
        ({"prompt_cache_key": "a"}, None, "b", "prompt_cache_key", "X-Session-Id"),
        ({"prompt_cache_key": "a"}, "a", "b", "X-Conversation-Id", "X-Session-Id"),
    ],
)
def test_conflicting_sources_are_a_400_naming_both(
    body: dict[str, object], conv_header: str | None, session: str | None, first: str, second: str
) -> None:
    with pytest.raises(ApiError) as err:
        conversation(body, conv_header, session)
    assert err.value.status == 400 and err.value.param == second
    assert first in err.value.message and second in err.value.message


def test_every_source_is_validated_and_named() -> None:
    with pytest.raises(ApiError) as err:
        conversation({"prompt_cache_key": 5})
    assert err.value.param == "prompt_cache_key"
    with pytest.raises(ApiError) as err:
        conversation({}, session="x" * 257)
    assert err.value.param == "X-Session-Id"


def test_cache_salt_is_read_and_forwarded_to_both_engines_unchanged() -> None:
    salt = "tenant-a/ünïcode salt"
    req = parse({**CHAT, "cache_salt": salt})
    assert req.cache_salt == salt
    for body in (protocol.prefill_body(req, FIRST_TURN), protocol.decode_body(req, None)):
        assert body["cache_salt"] == salt
    assert parse(CHAT).cache_salt == ""
    assert bad({**CHAT, "cache_salt": ""}).param == "cache_salt"  # vLLM refuses an empty one too
    assert bad({**CHAT, "cache_salt": 7}).param == "cache_salt"
    assert parse({**CHAT, "cache_salt": None}).cache_salt == ""
