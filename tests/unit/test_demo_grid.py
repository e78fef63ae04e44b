"""The grid's verdict: the planner's option against the oracle and recompute (no processes)."""

from __future__ import annotations

import json
from pathlib import Path

from boomerang_tools.demo.grid import Point, summary, table, verdict, write_report
from rich.console import Console


def point(decision: str, **options: float) -> Point:
    return Point("qwen3-8b-h200", 8000, 3.0, False, decision, 100.0, options)


def test_the_fastest_option_is_the_oracle_and_a_chosen_one_within_five_percent_passes() -> None:
    v = verdict(point("PULL", recompute=100.0, pull=101.5, prefill_on_decode=97.0))
    assert v["oracle"] == "prefill_on_decode" and v["chosen"] == "pull"
    assert v["within_oracle"] and v["not_above_recompute"] and v["ok"]


def test_a_choice_six_percent_over_the_oracle_misses() -> None:
    v = verdict(point("PULL", recompute=100.0, pull=106.5, prefill_on_decode=100.4))
    assert not v["within_oracle"] and not v["ok"]


def test_a_choice_within_the_oracle_but_over_recompute_by_more_than_two_percent_misses() -> None:
    # The oracle is recompute's within 5%, but the chosen pull is 3% slower than recompute.
    v = verdict(point("PULL", recompute=100.0, pull=103.0, prefill_on_decode=150.0))
    assert v["within_oracle"] and not v["not_above_recompute"] and not v["ok"]


def test_cold_counts_as_recompute_and_an_unknown_decision_never_passes() -> None:
    assert verdict(point("COLD", recompute=100.0, pull=300.0, prefill_on_decode=120.0))["ok"]
    v = verdict(point("ENGINE", recompute=100.0, pull=300.0, prefill_on_decode=120.0))
    assert v["chosen_ms"] is None and not v["ok"]


def test_the_summary_counts_and_the_report_keeps_the_replays_figures(tmp_path: Path) -> None:
    points = [point("RECOMPUTE", recompute=100.0, pull=300.0, prefill_on_decode=120.0),
              point("PULL", recompute=100.0, pull=300.0, prefill_on_decode=120.0)]
    assert summary(points) == {"points": 2, "within_oracle": 1, "not_above_recompute": 1,
                               "on_p": 2, "on_p_within_best_on_p": 1, "ok": False}
    assert not summary([])["ok"]
    (tmp_path / "demo-report.json").write_text(json.dumps({"profiles": ["x"]}))
    write_report(tmp_path, points, 1.0)
    report = json.loads((tmp_path / "demo-report.json").read_text())
    assert report["profiles"] == ["x"]
    assert [p["ok"] for p in report["grid"]["points"]] == [True, False]
    console = Console(width=240, record=True)
    console.print(table(points, "grid"))
    text = console.export_text()
    assert "NO" in text and "yes" in text
