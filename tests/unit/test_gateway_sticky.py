"""Sticky routing: the gateway's own prefill choice by a hash of the conversation id."""

from __future__ import annotations

from collections import Counter

import httpx2 as httpx
from boomerang_gateway.engine_routing import PREFILL, EngineRouting

URLS = [f"http://p{i}:8000" for i in range(4)]


async def _pool(urls: list[str] = URLS) -> EngineRouting:
    pool = EngineRouting(httpx.AsyncClient(), urls, [], None, refresh_seconds=60)
    for engine in pool.engines:
        engine.models = ("m",)
    return pool


async def test_a_conversation_always_reaches_the_same_engine_however_busy() -> None:
    pool = await _pool()
    first = pool.choose(PREFILL, "m", key="conv-1")
    assert first is not None
    for i in range(50):
        first.in_flight = i  # the least-busy rule would move it; the key does not
        assert pool.choose(PREFILL, "m", key="conv-1") is first
    assert pool.choose(PREFILL, "m") is not first  # without a key: the least busy


async def test_conversations_spread_over_the_engines() -> None:
    pool = await _pool()
    counts = Counter(pool.choose(PREFILL, "m", key=f"conv-{i}").url for i in range(400))  # type: ignore[union-attr]
    assert set(counts) == set(URLS) and min(counts.values()) > 50


async def test_an_engine_going_down_moves_only_its_own_conversations() -> None:
    pool = await _pool()
    before = {i: pool.choose(PREFILL, "m", key=f"c{i}").url for i in range(200)}  # type: ignore[union-attr]
    pool.mark_down(URLS[1])
    after = {i: pool.choose(PREFILL, "m", key=f"c{i}").url for i in range(200)}  # type: ignore[union-attr]
    moved = {i for i in before if before[i] != after[i]}
    assert moved and all(before[i] == URLS[1] for i in moved)
    assert URLS[1] not in after.values()
    pool.table.down_until.clear()
    assert {i: pool.choose(PREFILL, "m", key=f"c{i}").url for i in range(200)} == before  # type: ignore[union-attr]


async def test_a_retry_avoiding_the_tried_engine_is_the_next_by_hash() -> None:
    pool = await _pool()
    first = pool.choose(PREFILL, "m", key="conv-9")
    assert first is not None
    second = pool.choose(PREFILL, "m", avoid={first.url}, key="conv-9")
    assert second is not None and second is not first
    assert pool.choose(PREFILL, "m", avoid={first.url}, key="conv-9") is second
    assert pool.choose(PREFILL, "m", avoid=set(URLS), key="conv-9") is None
