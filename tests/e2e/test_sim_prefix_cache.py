"""`boomerang sim --prefix-cache-blocks`: P's own prefix cache, as real processes over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.e2e.test_sim_engines import FAST, FIRST_TURN, Engine, convo, delta, plain_reply, turn
from tests.support.procs import ServiceProcess

pytestmark = pytest.mark.e2e

CAPACITY = 24  # blocks of 16 tokens: room for about two of these conversations


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, Engine]]:
    specs = {
        # Threshold 0: a pull of the few tokens P's cache lacks is still made.
        "p": ["--role", "prefill", "--prefix-cache-blocks", str(CAPACITY), "--recompute-threshold", "0",
              "--enable-prompt-tokens-details", *FAST],
        "d": ["--role", "decode", "--ttl", "60", "--enable-prompt-tokens-details", *FAST],
    }
    procs = {name: ServiceProcess(["sim", "--port", "0", *args], name=f"sim-pc-{name}") for name, args in specs.items()}
    with ThreadPoolExecutor(len(procs)) as pool:
        list(pool.map(lambda p: p.start(), procs.values()))
    running = {name: Engine(proc) for name, proc in procs.items()}
    yield running
    for engine in running.values():
        engine.http.close()
        engine.proc.kill()


def _prompt_len(p: Engine, messages: list[dict[str, Any]]) -> int:
    return len(p.post("/tokenize", {"messages": messages, "add_generation_prompt": True}).json()["tokens"])


def _usage_cached(p: Engine, d: Engine, messages: list[dict[str, Any]], params: dict[str, Any]) -> tuple[int, str]:
    """One turn, P then D streaming; D's usage cached_tokens and the reply."""
    body = p.post("/v1/chat/completions", {"messages": messages, "max_tokens": 1, "kv_transfer_params": params}).json()
    chunks = d.stream("/v1/chat/completions", {"messages": messages, "kv_transfer_params": body["kv_transfer_params"],
                                               "stream_options": {"include_usage": True}})
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c.get("choices"))
    assert body["usage"]["prompt_tokens_details"] == chunks[-1]["usage"]["prompt_tokens_details"]
    return chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"], text


def test_a_later_turn_hits_p_own_cache_and_usage_reports_it(engines: dict[str, Engine]) -> None:
    p, d = engines["p"], engines["d"]
    messages = convo("sticky")
    cached, text = _usage_cached(p, d, messages, FIRST_TURN)
    assert cached == 0
    n1 = _prompt_len(p, messages)
    messages = [*messages, {"role": "assistant", "content": text}, {"role": "user", "content": "Next."}]
    before = p.stats()
    cached, text = _usage_cached(p, d, messages, FIRST_TURN)  # no pull: P's cache alone
    assert cached == n1 // 16 * 16 > 0
    assert text == plain_reply(d, messages)
    after = p.stats()
    assert delta(before, after, "computed_tokens", "prefix_cache_hits", "pulls") == {
        "computed_tokens": _prompt_len(p, messages) - cached, "prefix_cache_hits": cached, "pulls": 0}


def test_a_pull_fetches_only_what_p_cache_lacks(engines: dict[str, Engine]) -> None:
    p, d = engines["p"], engines["d"]
    messages = convo("both")
    t = turn(p, d, messages)
    n1 = _prompt_len(p, messages)
    messages = [*messages, {"role": "assistant", "content": t["text"]}, {"role": "user", "content": "Go on."}]
    n2 = _prompt_len(p, messages)
    before = p.stats()
    cached, text = _usage_cached(p, d, messages, t["d_params"])
    after = p.stats()
    local = n1 // 16 * 16
    count = min(t["d_params"]["remote_num_tokens"], n2 - 1)
    assert cached == count
    assert delta(before, after, "pulls", "pulled_tokens", "corrupt_pulls", "prefix_cache_hits") == {
        "pulls": 1, "pulled_tokens": count - local, "corrupt_pulls": 0, "prefix_cache_hits": local}
    assert text == plain_reply(d, messages)


def test_many_conversations_evict_each_other(engines: dict[str, Engine]) -> None:
    p, d = engines["p"], engines["d"]
    first = convo("evicted")
    _usage_cached(p, d, first, FIRST_TURN)
    for i in range(4):  # four other conversations, each near half the cache
        _usage_cached(p, d, convo(f"crowd-{i}"), FIRST_TURN)
    stats = p.stats()
    assert stats["prefix_cache_blocks"] <= CAPACITY and stats["prefix_cache_evicted_blocks"] > 0
    cached, _ = _usage_cached(p, d, [*first, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "Again."}],
                              FIRST_TURN)
    assert cached == 0
