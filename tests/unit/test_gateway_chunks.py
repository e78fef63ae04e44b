"""What the gateway captures from D's stream, what the client sees, and non-streaming folding."""

from __future__ import annotations

import json

from boomerang_gateway import protocol
from boomerang_gateway.chunks import Aggregate, Capture, for_client, lift_prompt_ids, sse
from boomerang_gateway.protocol import Kind

KV = {"do_remote_decode": True, "remote_block_ids": [[7, 8]], "remote_request_id": "r", "remote_num_tokens": 20}


def chat_stream() -> list[dict]:
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 5, "model": "m"}
    return [
        {**head, "prompt_token_ids": [1, 2, 3], "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {**head, "choices": [{"index": 0, "delta": {"content": "Hel"}, "token_ids": [10]}]},
        {**head, "choices": [{"index": 0, "delta": {"content": "lo",
                                                     "tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                                                     "function": {"name": "read", "arguments": '{"p'}}]},
                              "token_ids": [11]}]},
        {**head, "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '": 1}'}}]},
                              "token_ids": [12], "finish_reason": "stop", "stop_reason": None}],
         "kv_transfer_params": KV},
        {**head, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}},
    ]


def fold(request: protocol.ClientRequest, stream: list[dict]) -> Aggregate:
    """The non-streamed response's folding of `stream`, beside the turn's capture of it."""
    capture = Capture()
    agg = Aggregate(request, capture)
    for chunk in stream:
        capture.observe(chunk)
        agg.add(chunk)
    return agg


def req(**extra: object) -> protocol.ClientRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], **extra}
    return protocol.parse(Kind.CHAT, json.dumps(body).encode(), None)


def test_capture_keeps_prompt_and_output_ids_and_ds_final_params() -> None:
    cap = Capture()
    for chunk in chat_stream():
        cap.observe(chunk)
    assert cap.prompt_token_ids == [1, 2, 3] and cap.output_token_ids == [10, 11, 12]
    assert cap.kv_transfer_params == KV and cap.finish_reason == "stop"
    assert cap.first_token_at is not None and cap.finished_at is not None and cap.usage["total_tokens"] == 6


def test_completion_stream_prompt_ids_come_per_choice() -> None:
    cap = Capture()
    cap.observe({"choices": [{"index": 0, "text": "a", "prompt_token_ids": [4, 5], "token_ids": [9]}]})
    cap.observe({"choices": [{"index": 0, "text": "b", "token_ids": [8], "finish_reason": "length"}],
                 "kv_transfer_params": KV})
    assert cap.prompt_token_ids == [4, 5] and cap.output_token_ids == [9, 8] and cap.kv_transfer_params == KV


def test_prompt_ids_are_lifted_as_text_and_parsed_when_read() -> None:
    """The first chunk's prompt ids (any member position, compact or spaced, chat or per
    choice) leave the chunk as text, and what is left parses to the chunk without them."""
    head = {"id": "c", "object": "chat.completion.chunk", "created": 5, "model": "m"}
    role = {"index": 0, "delta": {"role": "assistant", "content": 'say "prompt_token_ids": [9]'}}
    chunks = [
        {**head, "choices": [role], "prompt_token_ids": [1, 2, 3]},  # vLLM's place: the last member
        {"prompt_token_ids": [1, 2, 3], **head, "choices": [role]},  # the first
        {**head, "choices": [{"index": 0, "text": "", "prompt_token_ids": [1, 2, 3], "token_ids": [7]}]},
    ]
    for chunk in chunks:
        for text in (json.dumps(chunk), json.dumps(chunk, separators=(",", ":"))):
            rest, ids = lift_prompt_ids(text)
            assert ids is not None and json.loads(ids) == [1, 2, 3], text
            without = json.loads(rest)
            expected = {k: v for k, v in chunk.items() if k != "prompt_token_ids"}
            expected["choices"] = [{k: v for k, v in c.items() if k != "prompt_token_ids"} for c in chunk["choices"]]
            assert without == expected
            cap = Capture()
            cap.observe(without, ids)
            assert cap.has_prompt_ids and cap.prompt_ids_text is not None  # not parsed yet
            assert cap.prompt_token_ids == [1, 2, 3] and cap.prompt_ids_text is None
    # Digits and commas that are not a list: lifted, then read as none.
    rest, ids = lift_prompt_ids('{"id":"c","prompt_token_ids":[1,,2]}')
    cap = Capture()
    cap.observe(json.loads(rest), ids)
    assert rest == '{"id":"c"}' and cap.has_prompt_ids and cap.prompt_token_ids is None
    # Only the text of a string mentions them, or they are not a list of ids: left whole.
    for text in (json.dumps({**head, "choices": [role]}), json.dumps({**head, "prompt_token_ids": None}),
                 json.dumps({"prompt_token_ids": [1]})):
        assert lift_prompt_ids(text) == (text, None)


def test_client_never_sees_the_handle_nor_unrequested_ids_or_usage() -> None:
    plain = req(stream=True)
    out = [for_client(c, plain) for c in chat_stream()]
    assert out[-1] is None  # the usage chunk the gateway asked for itself
    text = json.dumps([o for o in out if o])
    for field in ("kv_transfer_params", "token_ids", "prompt_token_ids", "usage", "remote_block_ids"):
        assert field not in text
    asked = req(stream=True, return_token_ids=True, stream_options={"include_usage": True})
    out = [for_client(c, asked) for c in chat_stream()]
    assert out[0]["prompt_token_ids"] == [1, 2, 3] and out[1]["choices"][0]["token_ids"] == [10]
    assert out[-1]["usage"]["total_tokens"] == 6 and "kv_transfer_params" not in out[3]


def test_aggregate_folds_a_chat_stream_into_one_response() -> None:
    out = fold(req(), chat_stream()).result()
    assert out["object"] == "chat.completion" and out["id"] == "chatcmpl-1" and out["created"] == 5
    choice = out["choices"][0]
    assert choice["message"]["content"] == "Hello" and choice["finish_reason"] == "stop"
    assert choice["message"]["tool_calls"] == [
        {"id": "call_a", "type": "function", "function": {"name": "read", "arguments": '{"p": 1}'}}]
    assert out["usage"]["completion_tokens"] == 3
    assert "token_ids" not in choice and "prompt_token_ids" not in out and "kv_transfer_params" not in out
    out = fold(req(return_token_ids=True), chat_stream()).result()
    assert out["choices"][0]["token_ids"] == [10, 11, 12] and out["prompt_token_ids"] == [1, 2, 3]


def test_aggregate_folds_a_completion_stream() -> None:
    comp = protocol.parse(Kind.COMPLETION, json.dumps({"model": "m", "prompt": "hi"}).encode(), None)
    out = fold(comp, [{"id": "cmpl-1", "created": 1, "model": "m", "choices": [{"index": 0, "text": "a "}]},
                      {"id": "cmpl-1", "choices": [{"index": 0, "text": "b", "finish_reason": "length"}]}]).result()
    assert out["object"] == "text_completion" and out["choices"][0]["text"] == "a b"
    assert out["choices"][0]["finish_reason"] == "length"


def test_sse_encoding() -> None:
    assert sse("[DONE]") == b"data: [DONE]\n\n"
    assert sse({"a": "é"}) == 'data: {"a":"é"}\n\n'.encode()
