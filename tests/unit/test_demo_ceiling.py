"""The demo holds each measured speedup against the simulator's own ceiling (issue 25's demo
target): the cost model's speedup for the same turns with nothing but the engines costing time."""

from __future__ import annotations

import pytest
from boomerang_tools.demo import report
from boomerang_tools.demo.client import TurnResult
from boomerang_tools.demo.runner import Record, RunResult
from boomerang_tools.demo.workload import Step
from boomerang_tools.sim.costmodel import profile

QWEN = profile("qwen3-32b")


def _turn(mode: str, deployment: str, step: Step | None, prompt: int, ttft: float, completion: int = 40,
          ok: bool = True) -> Record:
    return Record("qwen3-32b", mode, 0, deployment, step,
                  prompt, TurnResult(ok=ok, ttft_ms=ttft, text="t", completion_tokens=completion))


def _run(on_ttft: float, previous_ok: bool = True) -> RunResult:
    # The measured turn (24,000 tokens) follows a turn whose prompt and reply came to 23,015 + 40.
    run = RunResult()
    run.records += [_turn("off", "hook", None, 23015, 700.0), _turn("off", "hook", Step(24000, True), 24000, 800.0)]
    run.records += [_turn("on", "hook", None, 23015, 700.0, ok=previous_ok),
                    _turn("on", "hook", Step(24000, True), 24000, on_ttft)]
    return run


def test_the_ceiling_pulls_every_whole_block_the_decode_engine_retained() -> None:
    pulled = (23015 + 40) // 16 * 16
    expected = QWEN.ttft_ms(24000) / QWEN.ttft_ms(24000, pulled)
    assert _run(500.0).ceiling("qwen3-32b", 24000, "hook") == pytest.approx(expected)


def test_rows_give_the_share_of_the_ceiling_and_the_targets_say_which_points_miss() -> None:
    ceiling = QWEN.ttft_ms(24000) / QWEN.ttft_ms(24000, (23015 + 40) // 16 * 16)
    at_ceiling = 800.0 / ceiling  # the measured on-TTFT that exactly reaches the ceiling
    row, = report.rows(_run(at_ceiling), "qwen3-32b", (24000,), "hook")
    assert row["share_of_ceiling"] == pytest.approx(1.0, abs=0.01)
    slow, = report.rows(_run(at_ceiling / 0.9), "qwen3-32b", (24000,), "hook")
    assert slow["share_of_ceiling"] == pytest.approx(0.9, abs=0.01)
    targets = report.ceiling_targets([("qwen3-32b", {"hook": [slow], "gateway": [slow]})])
    assert targets["hook"]["met"] is False and targets["hook"]["below"] == {"qwen3-32b 24,000": slow["share_of_ceiling"]}
    assert targets["gateway"]["met"] is True


def test_no_ceiling_without_the_turn_before() -> None:
    assert _run(500.0, previous_ok=False).ceiling("qwen3-32b", 24000, "hook") is None
    row, = report.rows(_run(500.0, previous_ok=False), "qwen3-32b", (24000,), "hook")
    assert "share_of_ceiling" not in row
