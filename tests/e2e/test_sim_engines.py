"""`boomerang sim` as real processes, prefill and decode, driven over HTTP as vLLM's proxy does."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from boomerang_tools.sim.tokenizer import IM_END, SPECIAL_TOKENS, piece_id

from tests.support.procs import ServiceProcess, wait_for

IM_START, NL = SPECIAL_TOKENS["<|im_start|>"], piece_id("\n")

pytestmark = pytest.mark.e2e

FAST = ["--time-scale", "0.01"]
FIRST_TURN = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
              "remote_block_ids": None, "remote_host": None, "remote_port": None}
CONTRACT = {"do_remote_decode", "do_remote_prefill", "remote_block_ids", "remote_engine_id", "remote_request_id",
            "remote_host", "remote_port", "tp_size", "dcp_size", "pp_size", "remote_num_tokens",
            "remote_blocks_expiry_time", "remote_registration_generation", "transfer_mode"}


class Engine:
    """A running simulator and an HTTP client for it."""

    def __init__(self, proc: ServiceProcess):
        self.proc = proc
        self.url = f"http://{proc.address}"
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def stats(self) -> dict[str, Any]:
        return self.http.get("/sim/stats").json()  # type: ignore[no-any-return]

    def post(self, path: str, body: Any) -> httpx.Response:
        return self.http.post(path, json=body)

    def stream(self, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """Every SSE data chunk of a streaming request; the stream must end with [DONE]."""
        with self.http.stream("POST", path, json={**body, "stream": True}) as resp:
            assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
            data = [line[len("data: "):] for line in resp.iter_lines() if line.startswith("data: ")]
        assert data[-1] == "[DONE]"
        return [json.loads(d) for d in data[:-1]]


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, Engine]]:
    # Clock offsets far apart in both directions: P must convert D's expiry time with the
    # offset it measured at handshake, or it would pull from `d` never and decline `d_slow` never.
    specs = {
        "p": ["--role", "prefill", "--clock-offset", "300000", *FAST],
        "d": ["--role", "decode", "--ttl", "60", "--clock-offset", "100", *FAST],
        # Real-time latencies and a 1 s TTL: for expiry, aborts and restarts.
        "d_slow": ["--role", "decode", "--ttl", "1", "--time-scale", "1", "--clock-offset", "900000"],
        "p_think": ["--role", "prefill", "--strip-reasoning", *FAST],
        "d_think": ["--role", "decode", "--strip-reasoning", *FAST],
        # vLLM's --enable-prompt-tokens-details: usage carries prompt_tokens_details.cached_tokens.
        "p_details": ["--role", "prefill", "--enable-prompt-tokens-details", *FAST],
        "d_details": ["--role", "decode", "--enable-prompt-tokens-details", *FAST],
    }
    procs = {name: ServiceProcess(["sim", "--port", "0", *args], name=f"sim-{name}") for name, args in specs.items()}
    with ThreadPoolExecutor(len(procs)) as pool:
        list(pool.map(lambda p: p.start(), procs.values()))
    running = {name: Engine(proc) for name, proc in procs.items()}
    yield running
    for engine in running.values():
        engine.http.close()
        engine.proc.kill()


def turn(p: Engine, d: Engine, messages: list[dict[str, Any]], params: dict[str, Any] | None = None) -> dict[str, Any]:
    """One turn the way vLLM's multi-turn proxy runs it: P (max_tokens 1), then D streaming."""
    pr = p.post("/v1/chat/completions", {"messages": messages, "max_tokens": 1, "kv_transfer_params": params or FIRST_TURN})
    assert pr.status_code == 200, pr.text
    p_params = pr.json()["kv_transfer_params"]
    chunks = d.stream("/v1/chat/completions", {"messages": messages, "return_token_ids": True,
                                               "kv_transfer_params": p_params})
    finals = [c for c in chunks if "kv_transfer_params" in c]
    assert len(finals) == 1 and finals[0] is chunks[-1]
    return {
        "p_params": p_params,
        "chunks": chunks,
        "text": "".join(c["choices"][0]["delta"].get("content", "") for c in chunks),
        "token_ids": [t for c in chunks for t in c["choices"][0].get("token_ids", [])],
        "prompt_ids": chunks[0]["prompt_token_ids"],
        "d_params": finals[0]["kv_transfer_params"],
    }


def plain_reply(engine: Engine, messages: list[dict[str, Any]]) -> str:
    """What a single engine answers with no transfer at all (the ground truth)."""
    r = engine.post("/v1/chat/completions", {"messages": messages})
    assert r.status_code == 200 and r.json()["kv_transfer_params"] is None
    return r.json()["choices"][0]["message"]["content"]  # type: ignore[no-any-return]


def convo(tag: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": f"You are agent {tag}. " + "Use the tools. " * 30},
            {"role": "user", "content": f"Task {tag}: summarise the cache report."}]


def delta(before: dict[str, Any], after: dict[str, Any], *keys: str) -> dict[str, int]:
    return {k: after[k] - before[k] for k in keys}


def test_first_turn_prefill_then_decode_returns_the_contract(engines: dict[str, Engine]) -> None:
    p, d = engines["p"], engines["d"]
    messages = convo("first")
    tokens = p.post("/tokenize", {"model": "Qwen/Qwen3-32B", "messages": messages, "add_generation_prompt": True}).json()
    p_before = p.stats()
    t = turn(p, d, messages)
    pp = t["p_params"]
    assert pp["do_remote_prefill"] is True and pp["do_remote_decode"] is False
    assert pp["remote_engine_id"] == p_before["engine_id"]
    assert f"{pp['remote_host']}:{pp['remote_port']}" == p_before["side_channel"]
    assert len(pp["remote_block_ids"][0]) == math.ceil(tokens["count"] / 16)
    # D loaded P's blocks once; P freed them.
    assert p.stats()["held_handles"] == p_before["held_handles"]

    first = t["chunks"][0]
    assert first["object"] == "chat.completion.chunk" and first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert t["prompt_ids"] == tokens["tokens"]
    assert all("prompt_token_ids" not in c for c in t["chunks"][1:])
    assert t["chunks"][-1]["choices"][0]["finish_reason"] == "stop" and t["token_ids"][-1] == IM_END
    assert t["text"] == plain_reply(p, messages)

    dk, d_stats = t["d_params"], d.stats()
    assert set(dk) == CONTRACT
    assert dk["do_remote_decode"] is True and dk["do_remote_prefill"] is False and dk["transfer_mode"] == "pull"
    assert dk["remote_num_tokens"] == tokens["count"] + len(t["token_ids"])
    assert len(dk["remote_block_ids"]) == 1 and len(dk["remote_block_ids"][0]) == math.ceil(dk["remote_num_tokens"] / 16)
    assert dk["remote_engine_id"] == d_stats["engine_id"] and dk["remote_request_id"] == t["chunks"][0]["id"]
    assert f"{dk['remote_host']}:{dk['remote_port']}" == d_stats["side_channel"]
    assert (dk["tp_size"], dk["dcp_size"], dk["pp_size"]) == (1, 1, 1)
    assert dk["remote_registration_generation"] == d_stats["registration_generation"]
    # D's deadline is on D's own clock: its perf_counter plus the TTL, not wall time.
    assert 55 < dk["remote_blocks_expiry_time"] - d_stats["clock"] <= 60
    assert abs(dk["remote_blocks_expiry_time"] - time.time()) > 1000


def test_later_turns_pull_with_zero_corrupt_pulls(engines: dict[str, Engine]) -> None:
    p, d = engines["p"], engines["d"]
    messages = convo("multi")
    before = p.stats()
    t = turn(p, d, messages)
    pulled = 0
    for i in range(3):
        messages = [*messages, {"role": "assistant", "content": t["text"]}, {"role": "user", "content": f"Next step {i}."}]
        pulled += t["d_params"]["remote_num_tokens"]
        t = turn(p, d, messages, t["d_params"])
        assert t["text"] == plain_reply(d, messages)  # the pulled KV was the right KV
    after = p.stats()
    assert delta(before, after, "pulls", "pulled_tokens", "corrupt_pulls", "expired_or_freed_reads") == {
        "pulls": 3, "pulled_tokens": pulled, "corrupt_pulls": 0, "expired_or_freed_reads": 0}
    assert [e["outcome"] for e in after["recent"] if e["kind"] == "pull"][-3:] == ["ok", "ok", "ok"]


def test_prefill_reports_the_tokens_it_did_not_compute_as_vllm_does(engines: dict[str, Engine]) -> None:
    """vLLM 0.33.0's scheduler puts P's num_cached_tokens in the params P returns
    (`remote_prefill_cached_tokens`); with --enable-prompt-tokens-details P's usage says it too,
    and D reports P's figure, not its own transfer."""
    for p, d, details in ((engines["p"], engines["d"], False), (engines["p_details"], engines["d_details"], True)):
        messages = convo(f"cached-{details}")
        first = p.post("/v1/chat/completions", {"messages": messages, "max_tokens": 1, "kv_transfer_params": FIRST_TURN})
        assert first.json()["kv_transfer_params"]["remote_prefill_cached_tokens"] == 0
        t = turn(p, d, messages)
        messages = [*messages, {"role": "assistant", "content": t["text"]}, {"role": "user", "content": "Next."}]
        n = len(p.post("/tokenize", {"messages": messages, "add_generation_prompt": True}).json()["tokens"])
        pulled = min(t["d_params"]["remote_num_tokens"], n - 1)
        pr = p.post("/v1/chat/completions", {"messages": messages, "max_tokens": 1, "kv_transfer_params": t["d_params"]})
        body = pr.json()
        assert body["kv_transfer_params"]["remote_prefill_cached_tokens"] == pulled > 0
        assert body["usage"]["prompt_tokens_details"] == ({"cached_tokens": pulled} if details else None)
        chunks = d.stream("/v1/chat/completions", {"messages": messages, "kv_transfer_params": body["kv_transfer_params"],
                                                   "stream_options": {"include_usage": True}})
        usage = chunks[-1]["usage"]
        assert usage["prompt_tokens_details"] == ({"cached_tokens": pulled} if details else None)


def test_an_edited_history_is_a_corrupt_pull_that_still_returns_200(engines: dict[str, Engine]) -> None:
    p, d = engines["p"], engines["d"]
    messages = convo("edit")
    t = turn(p, d, messages)
    edited = [{"role": "system", "content": messages[0]["content"].replace("agent edit", "agent tide")}, *messages[1:],
              {"role": "assistant", "content": t["text"]}, {"role": "user", "content": "Go on."}]
    p_before, d_before = p.stats(), d.stats()
    t2 = turn(p, d, edited, t["d_params"])
    assert delta(p_before, p.stats(), "pulls", "corrupt_pulls") == {"pulls": 1, "corrupt_pulls": 1}
    # The wrong KV travels on to D, and the reply is not what the prompt should give.
    assert delta(d_before, d.stats(), "corrupt_loads") == {"corrupt_loads": 1}
    assert t2["text"] != plain_reply(d, edited)


def test_stripped_reasoning_breaks_the_prefix(engines: dict[str, Engine]) -> None:
    p, d = engines["p_think"], engines["d_think"]
    messages = convo("think")
    t = turn(p, d, messages)
    assert t["text"].startswith("<think>\n") and "</think>\n\n" in t["text"]
    nxt = [*messages, {"role": "assistant", "content": t["text"]}, {"role": "user", "content": "Why?"}]
    ids = p.post("/tokenize", {"messages": nxt}).json()["tokens"]
    held = t["prompt_ids"] + t["token_ids"]
    assert ids[: len(t["prompt_ids"])] == t["prompt_ids"] and ids[: len(held)] != held
    before = p.stats()
    turn(p, d, nxt, t["d_params"])  # a router that trusts remote_num_tokens blindly
    assert delta(before, p.stats(), "corrupt_pulls") == {"corrupt_pulls": 1}
    # A router that verified the prefix forwards only the tokens that match: a clean pull.
    t = turn(p, d, convo("think2"))
    nxt = [*convo("think2"), {"role": "assistant", "content": t["text"]}, {"role": "user", "content": "Why?"}]
    before = p.stats()
    turn(p, d, nxt, {**t["d_params"], "remote_num_tokens": len(t["prompt_ids"])})
    assert delta(before, p.stats(), "pulls", "corrupt_pulls", "pulled_tokens") == {
        "pulls": 1, "corrupt_pulls": 0, "pulled_tokens": len(t["prompt_ids"])}


def test_a_handle_is_good_for_exactly_one_read(engines: dict[str, Engine]) -> None:
    p, d = engines["p"], engines["d"]
    messages = convo("once")
    t = turn(p, d, messages)
    nxt = [*messages, {"role": "assistant", "content": t["text"]}, {"role": "user", "content": "Again."}]
    p_before, d_before = p.stats(), d.stats()
    first = p.post("/v1/chat/completions", {"messages": nxt, "max_tokens": 1, "kv_transfer_params": t["d_params"]})
    second = p.post("/v1/chat/completions", {"messages": nxt, "max_tokens": 1, "kv_transfer_params": t["d_params"]})
    assert first.status_code == second.status_code == 200  # like vLLM: garbage, but HTTP 200
    assert delta(p_before, p.stats(), "pulls", "corrupt_pulls", "expired_or_freed_reads") == {
        "pulls": 2, "corrupt_pulls": 0, "expired_or_freed_reads": 1}
    assert delta(d_before, d.stats(), "reads_served", "reads_refused") == {"reads_served": 1, "reads_refused": 1}
    assert p.stats()["recent"][-1]["outcome"] == "garbage_freed"


def test_decode_frees_blocks_at_its_ttl(engines: dict[str, Engine]) -> None:
    p, d = engines["p"], engines["d_slow"]
    messages = convo("ttl")
    t = turn(p, d, messages)
    nxt = [*messages, {"role": "assistant", "content": t["text"]}, {"role": "user", "content": "Later."}]
    assert d.stats()["retained_handles"] >= 1
    assert wait_for(lambda: d.stats()["retained_handles"] == 0, timeout=5)
    before = p.stats()
    # A router that drops the expiry field: P reads blocks D already freed.
    unchecked = {k: v for k, v in t["d_params"].items() if k != "remote_blocks_expiry_time"}
    assert p.post("/v1/chat/completions", {"messages": nxt, "max_tokens": 1, "kv_transfer_params": unchecked}).status_code == 200
    assert delta(before, p.stats(), "expired_or_freed_reads") == {"expired_or_freed_reads": 1}


def test_prefill_declines_a_pull_close_to_expiry(engines: dict[str, Engine]) -> None:
    p, d = engines["p"], engines["d_slow"]
    messages = convo("margin")
    t = turn(p, d, messages)  # a 1 s TTL is inside P's 5 s margin from the start
    nxt = [*messages, {"role": "assistant", "content": t["text"]}, {"role": "user", "content": "Now."}]
    before, d_before = p.stats(), d.stats()
    assert p.post("/v1/chat/completions", {"messages": nxt, "max_tokens": 1, "kv_transfer_params": t["d_params"]}).status_code == 200
    after = p.stats()
    assert delta(before, after, "declined_expiring", "pulls", "expired_or_freed_reads") == {
        "declined_expiring": 1, "pulls": 0, "expired_or_freed_reads": 0}
    assert after["computed_tokens"] - before["computed_tokens"] == len(p.post("/tokenize", {"messages": nxt}).json()["tokens"])
    assert d.stats()["reads_served"] == d_before["reads_served"]


def test_recompute_below_threshold_still_frees_the_blocks(engines: dict[str, Engine]) -> None:
    p, d = engines["p"], engines["d"]
    messages = convo("threshold")
    t = turn(p, d, messages)
    nxt = [*messages, {"role": "assistant", "content": t["text"]}, {"role": "user", "content": "Short."}]
    before, d_before = p.stats(), d.stats()
    params = {**t["d_params"], "remote_num_tokens": 40}  # 0 < 40 < kv_recompute_threshold (64)
    assert p.post("/v1/chat/completions", {"messages": nxt, "max_tokens": 1, "kv_transfer_params": params}).status_code == 200
    assert delta(before, p.stats(), "recomputed_below_threshold", "pulls") == {"recomputed_below_threshold": 1, "pulls": 0}
    d_after = d.stats()
    assert delta(d_before, d_after, "frees_requested", "retained_handles") == {"frees_requested": 1, "retained_handles": -1}


def test_an_aborted_stream_retains_nothing(engines: dict[str, Engine]) -> None:
    p, d = engines["p"], engines["d_slow"]
    messages = convo("abort")
    pp = p.post("/v1/chat/completions", {"messages": messages, "max_tokens": 1, "kv_transfer_params": FIRST_TURN}).json()
    before = d.stats()
    body = {"messages": messages, "stream": True, "max_tokens": 500, "ignore_eos": True,
            "kv_transfer_params": pp["kv_transfer_params"]}
    with d.http.stream("POST", "/v1/chat/completions", json=body) as resp:
        lines = resp.iter_lines()
        got = [next(lines) for _ in range(6)]  # a few tokens, then hang up
    assert any('"content":"' in line for line in got)
    assert wait_for(lambda: d.stats()["aborted"] == before["aborted"] + 1, timeout=5)
    after = d.stats()
    assert after["retained_turns"] == before["retained_turns"] and after["in_flight"] == 0
    assert after["used_blocks"] == after["retained_blocks"] + after["held_blocks"]


def test_a_non_streaming_client_that_leaves_aborts_too(engines: dict[str, Engine]) -> None:
    p, d = engines["p"], engines["d_slow"]
    messages = convo("abort2")
    pp = p.post("/v1/chat/completions", {"messages": messages, "max_tokens": 1, "kv_transfer_params": FIRST_TURN}).json()
    before = d.stats()
    body = {"messages": messages, "max_tokens": 500, "ignore_eos": True, "kv_transfer_params": pp["kv_transfer_params"]}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{d.url}/v1/chat/completions", json=body, timeout=0.5)  # 500 tokens take ~4 s
    assert wait_for(lambda: d.stats()["aborted"] == before["aborted"] + 1, timeout=5)
    assert d.stats()["retained_turns"] == before["retained_turns"]


def test_time_to_first_token_is_spent_as_real_time(engines: dict[str, Engine]) -> None:
    d = engines["d_slow"]  # --time-scale 1, qwen3-32b: alpha + beta * 2000 = 121.6 ms
    body = {"prompt": [7] * 2000, "max_tokens": 1}
    elapsed = []
    for _ in range(3):
        start = time.perf_counter()
        assert d.post("/v1/completions", body).status_code == 200
        elapsed.append(time.perf_counter() - start)
    assert 0.1216 <= min(elapsed) < 0.1216 + 0.15


def test_restart_bumps_generation_and_drops_every_block(engines: dict[str, Engine]) -> None:
    p, d = engines["p"], engines["d_slow"]
    messages = convo("restart")
    t = turn(p, d, messages)
    old_gen = t["d_params"]["remote_registration_generation"]
    r = d.http.post("/sim/restart").json()
    assert r["registration_generation"] == old_gen + 1 and r["dropped_handles"] >= 1
    stats = d.stats()
    assert stats["retained_blocks"] == 0 and stats["used_blocks"] == 0
    nxt = [*messages, {"role": "assistant", "content": t["text"]}, {"role": "user", "content": "After restart."}]
    before = p.stats()
    unchecked = {k: v for k, v in t["d_params"].items() if k != "remote_blocks_expiry_time"}
    p.post("/v1/chat/completions", {"messages": nxt, "max_tokens": 1, "kv_transfer_params": unchecked})
    assert delta(before, p.stats(), "expired_or_freed_reads") == {"expired_or_freed_reads": 1}
    assert turn(p, d, convo("restart2"))["d_params"]["remote_registration_generation"] == old_gen + 1


def test_completions_shapes_streaming_and_not(engines: dict[str, Engine]) -> None:
    p, d = engines["p"], engines["d"]
    prompt = "The KV cache of a long conversation " * 10
    pr = p.post("/v1/completions", {"prompt": prompt, "max_tokens": 1, "kv_transfer_params": FIRST_TURN}).json()
    assert pr["object"] == "text_completion" and pr["choices"][0]["finish_reason"] == "length"
    chunks = d.stream("/v1/completions", {"prompt": prompt, "max_tokens": 20, "return_token_ids": True,
                                          "kv_transfer_params": pr["kv_transfer_params"],
                                          "stream_options": {"include_usage": True}})
    ids = p.post("/tokenize", {"prompt": prompt}).json()["tokens"]
    assert chunks[0]["choices"][0]["prompt_token_ids"] == ids
    assert all(c["object"] == "text_completion" for c in chunks)
    body = [c for c in chunks if c["choices"]]
    assert all(len(c["choices"][0]["token_ids"]) == 1 for c in body)
    assert body[-1]["choices"][0]["finish_reason"] == "length" and "kv_transfer_params" in body[-1]
    assert body[-1]["kv_transfer_params"]["remote_num_tokens"] == len(ids) + 20
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": len(ids), "total_tokens": len(ids) + 20, "completion_tokens": 20, "prompt_tokens_details": None}
    full = d.post("/v1/completions", {"prompt": ids, "max_tokens": 5, "return_token_ids": True}).json()
    choice = full["choices"][0]
    assert choice["prompt_token_ids"] == ids and len(choice["token_ids"]) == 5 and full["kv_transfer_params"] is None
    assert full["usage"]["completion_tokens"] == 5 and isinstance(choice["text"], str)


def test_chat_non_streaming_with_token_ids(engines: dict[str, Engine]) -> None:
    d = engines["d"]
    messages = convo("nonstream")
    r = d.post("/v1/chat/completions", {"model": "Qwen/Qwen3-32B", "messages": messages, "max_completion_tokens": 4,
                                        "return_token_ids": True}).json()
    assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-")
    choice = r["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 4
    assert r["prompt_token_ids"] == d.post("/tokenize", {"messages": messages}).json()["tokens"]
    assert r["usage"]["prompt_tokens"] == len(r["prompt_token_ids"]) and "kv_transfer_params" in r


def test_tokenize_models_and_health(engines: dict[str, Engine]) -> None:
    p = engines["p"]
    t = p.post("/tokenize", {"model": "Qwen/Qwen3-32B", "messages": [{"role": "user", "content": "hi"}],
                             "add_generation_prompt": True}).json()
    # <|im_start|> user \n hi <|im_end|> \n <|im_start|> assistant \n
    assert t["count"] == len(t["tokens"]) == 9 and t["max_model_len"] == 40960
    assert [t["tokens"][i] for i in (0, 2, 4, 5, 6, 8)] == [IM_START, NL, IM_END, NL, IM_START, NL]
    assert p.post("/tokenize", {"prompt": "hi there"}).json()["count"] == 2
    models = p.http.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "Qwen/Qwen3-32B"
    health = p.http.get("/health")
    assert health.status_code == 200 and health.content == b""


@pytest.mark.parametrize(
    "body,status,param",
    [
        ({"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 50000}, 400, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "n"),
        ({"messages": [{"role": "user", "content": "x"}], "kv_transfer_params": {"do_remote_decode": True,
          "remote_block_ids": [[1]], "remote_engine_id": "e", "remote_request_id": "r", "remote_host": "127.0.0.1",
          "remote_port": "x"}}, 400, "kv_transfer_params"),
        ({"messages": "hello"}, 400, "messages"),
    ],
)
def test_bad_requests_get_vllm_errors(engines: dict[str, Engine], body: dict[str, Any], status: int, param: str) -> None:
    r = engines["p"].post("/v1/chat/completions", body)
    assert r.status_code == status
    err = r.json()["error"]
    assert err["code"] == status and err["param"] == param and err["message"] and err["type"]


def test_malformed_json_is_400(engines: dict[str, Engine]) -> None:
    r = engines["p"].http.post("/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"


def test_a_stock_openai_client_reads_the_stream(engines: dict[str, Engine]) -> None:
    from openai import OpenAI

    p, d = engines["p"], engines["d"]
    messages = convo("openai")
    client = OpenAI(base_url=f"{d.url}/v1", api_key="sim", max_retries=0)
    pp = p.post("/v1/chat/completions", {"messages": messages, "max_tokens": 1, "kv_transfer_params": FIRST_TURN}).json()
    stream = client.chat.completions.create(
        model="Qwen/Qwen3-32B", messages=messages, stream=True,  # type: ignore[arg-type]
        extra_body={"kv_transfer_params": pp["kv_transfer_params"], "return_token_ids": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain_reply(p, messages)
    assert (chunks[-1].model_extra or {})["kv_transfer_params"]["transfer_mode"] == "pull"
    client.close()


async def test_concurrent_conversations_never_cross(engines: dict[str, Engine]) -> None:
    p, d = engines["p"], engines["d"]
    before = p.stats()
    limits = httpx.Limits(max_connections=200)
    async with httpx.AsyncClient(timeout=30, limits=limits) as http:

        async def one_turn(messages: list[dict[str, Any]], params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
            pr = await http.post(f"{p.url}/v1/chat/completions",
                                 json={"messages": messages, "max_tokens": 1, "kv_transfer_params": params})
            body = {"messages": messages, "stream": True, "kv_transfer_params": pr.json()["kv_transfer_params"]}
            text, final = "", {}
            async with http.stream("POST", f"{d.url}/v1/chat/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: {"):
                        chunk = json.loads(line[6:])
                        text += chunk["choices"][0]["delta"].get("content", "")
                        final = chunk.get("kv_transfer_params", final)
            return text, final

        async def conversation(i: int) -> None:
            messages = convo(f"c{i}")
            text, params = await one_turn(messages, FIRST_TURN)
            for step in range(2):
                messages = [*messages, {"role": "assistant", "content": text}, {"role": "user", "content": f"s{step}"}]
                text, params = await one_turn(messages, params)

        await asyncio.gather(*(conversation(i) for i in range(40)))
    after = p.stats()
    assert delta(before, after, "pulls", "corrupt_pulls", "expired_or_freed_reads") == {
        "pulls": 80, "corrupt_pulls": 0, "expired_or_freed_reads": 0}
