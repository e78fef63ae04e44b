"""The simulated engine's own prefix cache: hits, LRU eviction at block granularity, cost."""

from __future__ import annotations

import asyncio

from boomerang_tools.sim.costmodel import PROFILES
from boomerang_tools.sim.engine import Engine, GenRequest, SimConfig
from boomerang_tools.sim.kvstore import PrefixCache

BS = 4
FIRST_TURN = {"do_remote_decode": True, "do_remote_prefill": False}


def test_a_prompt_hits_its_cached_whole_blocks_and_leaves_the_last_token() -> None:
    cache = PrefixCache(capacity_blocks=100, block_size=BS)
    prompt = list(range(10))
    assert cache.lookup(prompt).tokens == 0
    cache.insert(prompt, prompt)
    assert len(cache.blocks) == 2  # only full blocks are cached
    longer = prompt + [50, 51, 52, 53, 54]
    hit = cache.lookup(longer)
    assert (hit.tokens, hit.kv) == (8, list(range(8)))
    # The same prompt again: its last token is always computed, so 8 of its 12 tokens hit
    # once it fills three blocks, never all 12.
    twelve = list(range(12))
    cache.insert(twelve, twelve)
    assert cache.lookup(twelve).tokens == 8
    assert cache.lookup(twelve + [99]).tokens == 12


def test_no_hit_past_a_changed_token() -> None:
    cache = PrefixCache(capacity_blocks=100, block_size=BS)
    prompt = list(range(16))
    cache.insert(prompt, prompt)
    changed = list(prompt)
    changed[5] = 999  # inside the second block
    assert cache.lookup(changed + [1]).tokens == 4
    changed[0] = 999
    assert cache.lookup(changed + [1]).tokens == 0
    # A block whose own tokens match but whose prefix differs does not hit (chained hash).
    assert cache.lookup([7, 7, 7, 7] + prompt[4:] + [1]).tokens == 0


def test_lru_eviction_under_capacity_takes_the_oldest_conversation_tail_first() -> None:
    cache = PrefixCache(capacity_blocks=6, block_size=BS)
    a, b, c = ([k * 1000 + i for i in range(12)] for k in (1, 2, 3))  # three blocks each
    cache.insert(a, a)
    cache.insert(b, b)
    assert cache.lookup(a + [0]).tokens == 12 and cache.lookup(b + [0]).tokens == 12
    cache.insert(c, c)  # 9 blocks for 6: a, the least recently used, goes
    assert cache.evicted_blocks == 3 and len(cache.blocks) == 6
    assert cache.lookup(a + [0]).tokens == 0
    assert cache.lookup(b + [0]).tokens == 12 and cache.lookup(c + [0]).tokens == 12
    # Using b again makes it the most recent: c's blocks go next, from its end backwards,
    # so c keeps its head the longest.
    cache.insert(b, b)
    d = [4000 + i for i in range(4)]
    cache.insert(d, d)
    assert cache.lookup(c + [0]).tokens == 8
    assert cache.lookup(b + [0]).tokens == 12


def test_a_prompt_longer_than_the_cache_keeps_its_head() -> None:
    cache = PrefixCache(capacity_blocks=2, block_size=BS)
    prompt = list(range(20))
    cache.insert(prompt, prompt)
    assert len(cache.blocks) == 2 and cache.lookup(prompt + [1]).tokens == 8


def test_cached_blocks_keep_the_kv_they_really_hold() -> None:
    cache = PrefixCache(capacity_blocks=10, block_size=BS)
    prompt = list(range(8))
    garbage = [0] * 8  # KV that arrived corrupt is cached under the prompt's hash
    cache.insert(prompt, garbage)
    assert cache.lookup(prompt + [1]).kv == garbage


def test_capacity_zero_is_off() -> None:
    cache = PrefixCache(capacity_blocks=0, block_size=BS)
    cache.insert(list(range(8)), list(range(8)))
    assert not cache.enabled and not cache.blocks and cache.lookup(list(range(9))).tokens == 0


def _engine(prefix_cache_blocks: int) -> Engine:
    config = SimConfig(role="prefill", engine_id="sim-prefill-test", profile=PROFILES["qwen3-32b"], time_scale=0.0,
                       block_size=16, served_model_name="m", max_model_len=40960,
                       prefix_cache_blocks=prefix_cache_blocks)
    return Engine(config, generation=1)


async def _turn(engine: Engine, prompt: list[int], rid: str) -> tuple[int, dict[str, object]]:
    adm = engine.admit(GenRequest(prompt, max_tokens=4, eos="<|im_end|>", kv_transfer_params=dict(FIRST_TURN)), rid)
    tokens = [t async for t in engine.run(adm)]
    finish = tokens[-1].finish
    assert finish is not None and finish.kv_transfer_params is not None
    return finish.cached_tokens, finish.kv_transfer_params


def test_the_prefill_engine_computes_only_the_uncached_tokens_and_reports_the_rest() -> None:
    async def go() -> None:
        engine = _engine(prefix_cache_blocks=1000)
        first = list(range(1000, 1100))  # 100 tokens: 6 full blocks
        cached, params = await _turn(engine, first, "r1")
        assert cached == 0 and params["remote_prefill_cached_tokens"] == 0
        assert engine.stats.computed_tokens == 100
        second = first + list(range(5000, 5050))
        cached, params = await _turn(engine, second, "r2")
        # As vLLM reports it: P's returned params carry its cache hits, which D's usage reports.
        assert cached == 96 and params["remote_prefill_cached_tokens"] == 96
        assert engine.stats.computed_tokens == 100 + 150 - 96
        assert (engine.stats.prefix_cache_queries, engine.stats.prefix_cache_hits) == (250, 96)
        engine.restart()
        cached, _ = await _turn(engine, second + [7], "r3")
        assert cached == 0  # a restart empties the cache

    asyncio.run(go())


def test_prefix_caching_is_off_by_default() -> None:
    async def go() -> None:
        engine = _engine(prefix_cache_blocks=SimConfig.prefix_cache_blocks)
        prompt = list(range(200))
        await _turn(engine, prompt, "r1")
        cached, params = await _turn(engine, prompt + [1, 2, 3], "r2")
        assert cached == 0 and params["remote_prefill_cached_tokens"] == 0
        assert engine.stats.prefix_cache_queries == 0 and engine.stats.computed_tokens == 403

    asyncio.run(go())


def test_cache_hits_cost_nothing_in_the_cost_model() -> None:
    p = PROFILES["qwen3-32b"]
    assert p.prefill_ms(24000, 0, 23872) == p.prefill_ms(128)
    assert p.ttft_ms(24000, 0, 23872) < p.ttft_ms(24000, 23872) < p.ttft_ms(24000)
    assert p.standalone_ms(1000, 900) == p.standalone_ms(100)
