"""The demo's conversations hit AWS's context lengths to the token; its report has the issue's shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from boomerang_tools.demo import report
from boomerang_tools.demo.client import TurnResult
from boomerang_tools.demo.modes import MODES, OFF, parse_modes
from boomerang_tools.demo.runner import Record, RunResult
from boomerang_tools.demo.workload import (
    NEW_TOKENS,
    POINTS,
    QUICK_POINTS,
    AgentConversation,
    Step,
    filler,
    prepare,
    steps,
)
from boomerang_tools.sim import template
from boomerang_tools.sim.tokenizer import encode
from rich.console import Console


def test_filler_has_exactly_the_tokens_asked_for() -> None:
    import random

    rng = random.Random(3)
    for n in (0, 1, 7, 50, 333, 4000):
        assert len(encode(filler(rng, n))) == n


def test_probe_prompts_are_exact_and_add_about_128_tokens() -> None:
    conv = AgentConversation(seed=11, model="m")
    assert conv.prompt_tokens() < 1000
    conv.add_reply("I will look at the code first.")
    held = 0
    for step in steps(POINTS["qwen3-32b"]):
        n = prepare(conv, step)
        if step.probe:
            assert n == step.point
            assert NEW_TOKENS - 40 <= n - held <= NEW_TOKENS + 40, (step, n, held)
        reply = "Reading the block cache now."
        conv.add_reply(reply)
        held = n + len(encode(reply)) + 1  # + <|im_end|>, as the decode engine holds it
    text = template.render(conv.messages, add_generation_prompt=True, tools=conv.body()["tools"])
    assert len(encode(text)) > 24000
    assert set(QUICK_POINTS) == set(POINTS) and max(POINTS["glm-5-fp8"]) == 20000


def test_same_seed_same_conversation() -> None:
    a, b = AgentConversation(5, "m"), AgentConversation(5, "m")
    for conv in (a, b):
        prepare(conv, Step(2000, False))
    assert a.messages == b.messages
    c = AgentConversation(6, "m")
    prepare(c, Step(2000, False))
    assert c.messages != a.messages


def _rec(mode: str, point: int, ttft: float, text: str = "same", deployment: str = "gateway") -> Record:
    if deployment == "hook":  # the gateway does not know the plan; the client's usage shows the pull
        result = TurnResult(ok=True, ttft_ms=ttft, text=text, plan="ENGINE", reason="ENGINE_HOOK",
                            cached_tokens=point - 128 if mode == "on" else 0)
    else:
        result = TurnResult(ok=True, ttft_ms=ttft, text=text, plan="PULL" if mode == "on" else "COLD",
                            reused_tokens=point - 128)
    return Record("qwen3-32b", mode, 0, deployment, Step(point, True), point, result)


def test_report_rows_and_json_shape(tmp_path: Path) -> None:
    result = RunResult(records=[_rec("off", 2000, 160), _rec("on", 2000, 130), _rec("off", 24000, 900), _rec("on", 24000, 500)])
    rows = report.rows(result, "qwen3-32b", (2000, 24000))
    assert rows == [{"context_tokens": 2000, "ttft_off_ms": 160.0, "ttft_on_ms": 130.0, "speedup": 1.23},
                    {"context_tokens": 24000, "ttft_off_ms": 900.0, "ttft_on_ms": 500.0, "speedup": 1.8}]
    # Each deployment measures "on" only; its rows share the baseline deployment's "off".
    result.records += [_rec("on", 2000, 120, deployment="hook"), _rec("on", 24000, 450, deployment="hook")]
    hook_rows = report.rows(result, "qwen3-32b", (2000, 24000), "hook")
    assert [(r["ttft_off_ms"], r["ttft_on_ms"], r["speedup"]) for r in hook_rows] == [(160.0, 120.0, 1.33), (900.0, 450.0, 2.0)]
    # A deployment's rows add its share of the simulator's ceiling (tests/unit/test_demo_ceiling.py).
    gateway_rows = report.rows(result, "qwen3-32b", (2000, 24000), "gateway")
    assert [{k: r[k] for k in rows[0]} for r in gateway_rows] == rows
    measured: list[report.Measured] = [("qwen3-32b", {"gateway": rows, "hook": hook_rows})]
    off = {"turns": 2, "cached_tokens": 0, "pulls": 0}
    data = report.report(measured, 0, 0, off, {("qwen3-32b", "hook"): {"tokenize_calls": 0}})
    report.write_json(data, tmp_path / "r.json")
    loaded = json.loads((tmp_path / "r.json").read_text())
    assert set(loaded) == {"profiles", "ceiling_targets", "corrupt_pulls", "requests_failed", "off"}
    assert loaded["off"] == off
    assert [(p["profile"], p["mode"]) for p in loaded["profiles"]] == [("qwen3-32b", "gateway"), ("qwen3-32b", "hook")]
    assert set(loaded["profiles"][0]) == {"profile", "mode", "rows"}
    assert loaded["profiles"][1]["tokenize_calls"] == 0
    assert set(loaded["profiles"][0]["rows"][0]) == {"context_tokens", "ttft_off_ms", "ttft_on_ms", "speedup"}
    report.chart(measured, MODES, tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    console = Console(record=True, width=200)
    console.print(report.table("qwen3-32b", measured[0][1], MODES))
    shown = console.export_text()
    assert "on: gateway" in shown and "on: engine hook" in shown and "1.80×" in shown and "2.00×" in shown
    assert result.probe_plans("qwen3-32b", 24000, "gateway") == "23,872"
    assert result.probe_plans("qwen3-32b", 24000, "hook") == "23,872"  # from the usage's cached tokens
    assert result.mismatched_replies() == 0
    result.records.append(_rec("on", 8000, 1.0, "x"))
    result.records.append(_rec("off", 8000, 1.0, "y"))
    assert result.mismatched_replies() == 1
    result.records.append(_rec("on", 8000, 1.0, "z", deployment="hook"))  # each deployment is held against off
    assert result.mismatched_replies() == 2


def test_modes_are_a_list_parsed_by_name() -> None:
    assert [m.name for m in MODES] == ["gateway", "gateway-no-id", "hook", "prefix-cache"]
    no_id = parse_modes("gateway-no-id")[0]
    assert not no_id.conversation_id and no_id.boomerang and not no_id.hook
    assert all(m.conversation_id for m in MODES if m is not no_id)
    assert [m.name for m in parse_modes("hook,gateway,hook")] == ["hook", "gateway"]
    assert parse_modes("gateway")[0].hook is False and parse_modes("hook")[0].hook is True
    with pytest.raises(ValueError, match="sticky"):
        parse_modes("gateway,sticky")
    # The alternative to Boomerang alone is a selection too: the baseline has a deployment of its own.
    (alt,) = parse_modes("prefix-cache")
    assert not alt.boomerang and not alt.baseline
    assert "--prefix-cache-blocks" in alt.sim_args and "--sticky-prefill" in alt.gateway_args
    # The baseline is no mode to choose, and nothing in it plans: no router, no hook.
    assert OFF not in MODES and OFF.baseline and not OFF.hook and not OFF.boomerang
    assert OFF.gateway_args == ("--router", "") and OFF.sim_args == ()


def test_a_mode_without_ids_sends_no_conversation_header() -> None:
    from boomerang_tools.demo.runner import id_headers

    assert id_headers("c-1", True) == {"X-Conversation-Id": "c-1"}
    assert id_headers("c-1", False) == {}


def test_server_timing_and_overhead() -> None:
    from boomerang_tools.demo.client import server_timing

    assert server_timing({"server-timing": "tokenize;dur=3.10, plan;dur=1.25, prefill;dur=100"}) == {
        "tokenize": 3.1, "plan": 1.25, "prefill": 100.0}
    assert server_timing({}) == {}
    rec = _rec("on", 2000, 130)
    rec.result.headers = {"server-timing": "tokenize;dur=4.0, plan;dur=2.0, prefill;dur=90"}
    assert RunResult(records=[rec]).overhead_ms("qwen3-32b", 2000) == 6.0
