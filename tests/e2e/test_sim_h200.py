"""The H200 profiles as real processes: a turn's time matches the cost model (the simulator
charges none of its own time), the link is settable, and a new turn can be prefilled on D.

Real time (`--time-scale 1`), Boomerang bypassed: the test drives P and D as vLLM's proxy does,
with token-id prompts of exact lengths, and times each turn to D's first streamed token."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from boomerang_tools.sim.costmodel import Link, profile

from tests.support.procs import ServiceProcess

pytestmark = pytest.mark.e2e

PROFILE = profile("qwen3-32b-h200")
MODEL = PROFILE.served_model_name
FIRST_TURN = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
              "remote_block_ids": None, "remote_host": None, "remote_port": None}
NEW_TOKENS = 128
REPLY = 8


class Engine:
    def __init__(self, proc: ServiceProcess):
        self.url = f"http://{proc.address}"
        self.http = httpx.Client(base_url=self.url, timeout=60)

    def stats(self) -> dict[str, Any]:
        return self.http.get("/sim/stats").json()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, Engine]]:
    common = ["--profile", "qwen3-32b-h200", "--time-scale", "1", "--enable-prompt-tokens-details"]
    specs = {
        "p": ["--role", "prefill", *common],
        # Prefix caching on D: its cache holds each conversation's history, so a new turn sent
        # straight to it (no kv_transfer_params) is prefilled over it.
        "d": ["--role", "decode", "--prefix-cache-blocks", "20000", *common],
        # Prefix caching on P: a shared system prompt it holds is neither pulled nor recomputed.
        "p_cache": ["--role", "prefill", "--prefix-cache-blocks", "20000", *common],
    }
    procs = {name: ServiceProcess(["sim", "--port", "0", *args], name=f"sim-h200-{name}") for name, args in specs.items()}
    with ThreadPoolExecutor(len(procs)) as pool:
        list(pool.map(lambda p: p.start(), procs.values()))
    running = {name: Engine(proc) for name, proc in procs.items()}
    # Warm up: connections, each P's handshake with D, the first pull.
    for tag, p in ((1, running["p"]), (3, running["p_cache"])):
        first = prompt_of(tag, 200)
        _, _, retained, reply = disaggregated(p, running["d"], first, FIRST_TURN)
        disaggregated(p, running["d"], first + reply + prompt_of(tag + 1, 100), retained)
    yield running
    for name, engine in running.items():
        engine.http.close()
        procs[name].kill()


def late(*engines: Engine) -> dict[str, Any]:
    """How late the engines' first tokens came after the model's time (real ms, p50/max): when
    a timing assertion fails, what the simulator's own work (or a starved CPU) added."""
    return {e.url: (e.stats()["first_token_late_ms_p50"], e.stats()["first_token_late_ms_max"]) for e in engines}


def fresh(*engines: Engine) -> None:
    """Zero the engines' counters, so their lateness figures cover the next turn only."""
    for e in engines:
        assert e.http.post("/sim/reset-stats").status_code == 200


def on_time(measured_ms: float, expected_ms: float, *engines: Engine) -> None:
    """A turn took the profile's time. The client's own clock bounds it from below (the engines
    never answer early); each engine's own clock says how late its step ended after the time the
    cost model gave it, and those delays together stay inside 5% of the turn: the simulator's own
    work (parsing, tokenizing, moving blocks) happens inside the modelled time, not after it. The
    client's HTTP round trips are not the simulator's and are not counted against it."""
    delays = [e.stats()["first_token_late_ms_max"] for e in engines]
    assert None not in delays, delays  # every engine ran a step of the turn
    lateness = sum(delays)
    assert measured_ms >= expected_ms * 0.99, (measured_ms, expected_ms, late(*engines))
    assert lateness <= expected_ms * 0.05, (lateness, expected_ms, measured_ms, late(*engines))


def prompt_of(tag: int, n: int) -> list[int]:
    return [(tag * 7919 + i * 104729) % 1200 + 1 for i in range(n)]


def first_token_ms(engine: Engine, body: dict[str, Any], started: float,
                   token_ids: bool = True) -> tuple[float, dict[str, Any], list[int]]:
    """Stream a completion from `engine`: ms from `started` to the first token, the params on
    the last chunk, and (with `token_ids`) every generated token id."""
    first, params, ids = None, {}, []
    with engine.http.stream("POST", "/v1/completions", json={**body, "model": MODEL, "stream": True,
                                                               "return_token_ids": token_ids}) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if first is None:
                first = (time.perf_counter() - started) * 1000
            ids += chunk["choices"][0].get("token_ids") or []
            params = chunk.get("kv_transfer_params") or params
    assert first is not None
    return first, params, ids


def disaggregated(p: Engine, d: Engine, prompt: list[int], p_params: dict[str, Any],
                  timed: bool = False) -> tuple[float, dict[str, Any], dict[str, Any], list[int]]:
    """One turn as the proxy runs it: P (max_tokens 1) then D streaming; TTFT from P's request
    (`timed`: nothing asked of the engines that a proxy would not ask, such as token ids)."""
    started = time.perf_counter()
    pr = p.http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1,
                                              "kv_transfer_params": p_params})
    assert pr.status_code == 200, pr.text
    body = pr.json()
    ttft, d_params, ids = first_token_ms(d, {"prompt": prompt, "max_tokens": REPLY, "ignore_eos": True,
                                            "kv_transfer_params": body["kv_transfer_params"]}, started, not timed)
    return ttft, body, d_params, ids


@pytest.mark.parametrize("context", [2000, 24000])
def test_a_pulled_turn_and_a_recompute_take_the_profile_s_time(engines: dict[str, Engine], context: int) -> None:
    p, d = engines["p"], engines["d"]
    first = prompt_of(context, context - NEW_TOKENS - REPLY)
    _, _, retained, reply = disaggregated(p, d, first, FIRST_TURN)
    assert retained["remote_num_tokens"] == len(first) + REPLY
    prompt = first + reply + prompt_of(context + 1, NEW_TOKENS)
    assert len(prompt) == context

    fresh(p, d)
    pulled_ms, p_body, _, _ = disaggregated(p, d, prompt, retained, timed=True)
    pulled = p_body["kv_transfer_params"]["remote_prefill_cached_tokens"]
    assert pulled == len(first) + REPLY  # everything D retained
    expected = PROFILE.ttft_ms(context, pulled)
    # The turn ends when the model says: the simulator's own work (JSON, tokenizing, moving the
    # blocks) is inside that time, and only the client's own round trips are added.
    on_time(pulled_ms, expected, p, d)

    fresh(p, d)
    recompute_ms, _, _, _ = disaggregated(p, d, prompt, FIRST_TURN, timed=True)
    on_time(recompute_ms, PROFILE.ttft_ms(context), p, d)


def test_the_link_is_set_per_decode_engine_and_prices_the_pull(engines: dict[str, Engine]) -> None:
    p, d = engines["p"], engines["d"]
    d_id = d.stats()["engine_id"]
    assert p.stats()["link"] == {"gbps": 55.0, "fixed_ms": 0.0}
    bad = p.http.post("/sim/link", json={"gbps": 0})
    assert bad.status_code == 400 and "gbps" in bad.text
    slow = p.http.post("/sim/link", json={"remote_engine_id": d_id, "gbps": 5, "fixed_ms": 20})
    assert slow.status_code == 200 and p.stats()["links"] == {d_id: {"gbps": 5.0, "fixed_ms": 20.0}}
    try:
        first = prompt_of(5, 8000 - NEW_TOKENS - REPLY)
        _, _, retained, reply = disaggregated(p, d, first, FIRST_TURN)
        prompt = first + reply + prompt_of(6, NEW_TOKENS)
        fresh(p, d)
        ttft, body, _, _ = disaggregated(p, d, prompt, retained, timed=True)
        pulled = body["kv_transfer_params"]["remote_prefill_cached_tokens"]
        expected = PROFILE.ttft_ms(len(prompt), pulled, 0, Link(5.0, 20.0))
        assert expected > PROFILE.ttft_ms(len(prompt), pulled) + 300  # 2 GB at 5 GB/s
        on_time(ttft, expected, p, d)
    finally:
        p.http.post("/sim/link", json={"remote_engine_id": d_id, "gbps": 55.0})


def test_a_new_turn_prefilled_on_d_over_its_history_pauses_its_decodes(engines: dict[str, Engine]) -> None:
    p, d = engines["p"], engines["d"]
    # A running decode on D: a long reply streaming while the new turn arrives.
    other = prompt_of(7, 1000)
    _, _, other_params, _ = disaggregated(p, d, other, FIRST_TURN)
    first = prompt_of(8, 16000 - NEW_TOKENS - REPLY)
    _, _, _, reply = disaggregated(p, d, first, FIRST_TURN)
    prompt = first + reply + prompt_of(9, NEW_TOKENS)
    p_prompt = p.http.post("/v1/completions", json={"model": MODEL, "prompt": other, "max_tokens": 1,
                                                     "kv_transfer_params": FIRST_TURN}).json()
    d.http.post("/sim/reset-stats")
    streaming = threading.Thread(target=first_token_ms, args=(d, {
        "prompt": other, "max_tokens": 40, "ignore_eos": True, "kv_transfer_params": p_prompt["kv_transfer_params"]},
        time.perf_counter()))
    streaming.start()
    time.sleep(0.4)
    # The new turn, straight to D with the whole prompt and no kv_transfer_params: what vLLM's
    # decode instance does with it (prefill locally; its prefix cache holds the history).
    started = time.perf_counter()
    resp = d.http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 4})
    ttft_bound = (time.perf_counter() - started) * 1000
    streaming.join()
    assert resp.status_code == 200, resp.text
    body = resp.json()
    hit = body["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert hit == (len(first) + REPLY - 1) // 16 * 16  # the history D holds, in whole blocks
    assert body["kv_transfer_params"] is None
    compute = PROFILE.compute_ms(len(prompt) - hit, hit)
    assert ttft_bound >= PROFILE.standalone_ms(len(prompt), hit) * 0.99
    stats = d.stats()
    assert stats["local_prefills"] == 1 and stats["computed_tokens"] >= len(prompt) - hit
    # The running decode made no step while the prefill computed: its ITL rose by that time.
    assert stats["decode_stalled_steps"] >= 1
    assert stats["decode_stall_ms"] == pytest.approx(compute, rel=0.02)
    assert stats["itl_ms_max"] >= PROFILE.itl_ms + compute * 0.95
    assert stats["itl_ms_p50"] == pytest.approx(PROFILE.itl_ms, rel=0.1)
    assert other_params["remote_num_tokens"] == len(other) + REPLY


def test_a_pull_moves_only_what_p_cache_lacks_and_costs_that(engines: dict[str, Engine]) -> None:
    p, d, p_cache = engines["p"], engines["d"], engines["p_cache"]
    system = prompt_of(11, 1024)  # a system prompt every conversation starts with
    # Another conversation's first turn on the caching P puts the system prompt in its cache.
    disaggregated(p_cache, d, system + prompt_of(12, 500), FIRST_TURN)
    # This conversation's first turn ran on the other P: the caching P holds only the system prompt.
    first = system + prompt_of(13, 8000 - 1024 - NEW_TOKENS - REPLY)
    _, _, retained, reply = disaggregated(p, d, first, FIRST_TURN)
    prompt = first + reply + prompt_of(14, NEW_TOKENS)
    fresh(p_cache, d)
    before = p_cache.stats()
    ttft, body, _, _ = disaggregated(p_cache, d, prompt, retained, timed=True)
    after = p_cache.stats()
    count = len(first) + REPLY
    assert body["kv_transfer_params"]["remote_prefill_cached_tokens"] == count
    assert {k: after[k] - before[k] for k in ("pulls", "pulled_tokens", "prefix_cache_hits", "computed_tokens")} == {
        "pulls": 1, "pulled_tokens": count - 1024, "prefix_cache_hits": 1024, "computed_tokens": len(prompt) - count}
    expected = PROFILE.ttft_ms(len(prompt), count - 1024, 1024)
    assert expected < PROFILE.ttft_ms(len(prompt), count)  # less to copy
    on_time(ttft, expected, p_cache, d)
