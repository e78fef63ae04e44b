"""A new turn prefilled on the decode engine: a request with no kv_transfer_params, computed
past what D's prefix cache holds of the conversation, pausing the decodes running on D."""

from __future__ import annotations

import asyncio

import pytest
from boomerang_tools.sim.costmodel import PROFILES
from boomerang_tools.sim.engine import Engine, GenRequest, SimConfig

PROFILE = PROFILES["qwen3-32b-h200"]
SCALE = 0.2


def _engine() -> Engine:
    config = SimConfig(role="decode", engine_id="sim-decode-test", profile=PROFILE, time_scale=SCALE, block_size=16,
                       served_model_name="m", max_model_len=40960, prefix_cache_blocks=10_000)
    return Engine(config, generation=1)


async def _run(engine: Engine, prompt: list[int], rid: str, max_tokens: int) -> tuple[list[int], int]:
    adm = engine.admit(GenRequest(prompt, max_tokens=max_tokens, eos="<|im_end|>", ignore_eos=True), rid)
    tokens = [t async for t in engine.run(adm)]
    finish = tokens[-1].finish
    assert finish is not None and finish.kv_transfer_params is None  # nothing retained for P
    return [t.id for t in tokens], finish.cached_tokens


def test_a_turn_prefilled_on_d_computes_past_its_history_and_pauses_its_decodes() -> None:
    async def go() -> None:
        engine = _engine()
        history = list(range(1000, 3000))
        reply, cached = await _run(engine, history, "turn-1", 6)
        assert cached == 0
        # A decode running on D while the next turn, sent straight to D, is prefilled.
        running = asyncio.ensure_future(_run(engine, list(range(50_000, 50_500)), "other", 40))
        await asyncio.sleep(0.1)
        engine.reset_stats()
        prompt = history + reply + list(range(7000, 7128))
        _, cached = await _run(engine, prompt, "turn-2", 2)
        await running
        held = (len(history) + len(reply) - 1) // 16 * 16  # the history's KV, in whole blocks
        assert cached == held
        s = engine.stats
        assert s.local_prefills == 1 and s.computed_tokens == len(prompt) - held
        compute = PROFILE.compute_ms(len(prompt) - held, held)
        assert s.decode_stalled_steps >= 1
        assert s.decode_stall_ms == pytest.approx(compute, rel=0.05)
        snap = engine.snapshot()
        assert snap["itl_ms_max"] >= PROFILE.itl_ms + compute * 0.9
        assert snap["itl_ms_p50"] == pytest.approx(PROFILE.itl_ms, rel=0.25)

    asyncio.run(go())


def test_with_no_prefill_on_d_its_decodes_are_never_paused() -> None:
    async def go() -> None:
        engine = _engine()
        await _run(engine, list(range(100, 600)), "a", 12)
        assert engine.stats.decode_steps == 11 and engine.stats.decode_stalled_steps == 0
        assert engine.stats.decode_stall_ms == 0.0

    asyncio.run(go())
