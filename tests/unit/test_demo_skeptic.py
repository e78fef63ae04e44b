"""The demo's answer to the skeptic: rows, table, verdict and chart from measured turns."""

from __future__ import annotations

from pathlib import Path

from boomerang_tools.demo import report, skeptic
from boomerang_tools.demo.client import TurnResult
from boomerang_tools.demo.modes import GATEWAY, PREFIX_CACHE
from boomerang_tools.demo.runner import Record, RunResult
from boomerang_tools.demo.workload import Step
from rich.console import Console


def _probe(mode: str, deployment: str, point: int, ttft: float, cached: int = 0, conversations: int = 1,
           rep: int = 0) -> Record:
    result = TurnResult(ok=True, ttft_ms=ttft, text="t", cached_tokens=cached)
    return Record("qwen3-32b", mode, rep, deployment, Step(point, True), point, result, conversations)


def _result() -> RunResult:
    result = RunResult()
    for point, off, on in ((2000, 150.0, 130.0), (24000, 800.0, 450.0)):
        result.records += [_probe("off", "gateway", point, off), _probe("on", "gateway", point, on)]
        result.records.append(_probe("on", "prefix-cache", point, 0.4 * off, cached=point - 160))
    # Eight conversations: at 2k they fit in P's cache; at 24k they evict each other.
    for i in range(8):
        result.records.append(_probe("on", "prefix-cache", 2000, 60.0 + i, cached=1840, conversations=8, rep=i))
        result.records.append(_probe("on", "prefix-cache", 24000, 790.0 + i, cached=656, conversations=8, rep=i))
    return result


def test_rows_put_the_prefix_cache_beside_off_and_boomerang_per_level() -> None:
    result = _result()
    measured = skeptic.levels("qwen3-32b", (2000, 24000), [("qwen3-32b", 8, (2000, 24000)), ("glm-5-fp8", 8, (20000,))])
    assert measured == [(1, (2000, 24000)), (8, (2000, 24000))]
    one, eight = skeptic.report_entry(result, "qwen3-32b", PREFIX_CACHE, GATEWAY, measured)
    assert one["conversations"] == 1 and eight["conversations"] == 8
    assert [r["faster"] for r in one["rows"]] == ["prefix-cache", "prefix-cache"]
    assert [r["faster"] for r in eight["rows"]] == ["prefix-cache", "boomerang"]
    last = eight["rows"][-1]
    assert last["ttft_prefix_cache_ms"] == 793.5  # the median over the eight conversations
    assert (last["ttft_off_ms"], last["ttft_boomerang_ms"]) == (800.0, 450.0)  # measured one at a time
    assert (last["cached_tokens"], last["cached_share"]) == (656, 0.03)
    # A level one conversation was not measured at has no row, and no level mixes with another.
    assert skeptic.rows(result, "qwen3-32b", PREFIX_CACHE, GATEWAY, 32, (24000,)) == []


def test_verdict_says_where_boomerang_wins_and_where_not(tmp_path: Path) -> None:
    result = _result()
    entry = skeptic.report_entry(result, "qwen3-32b", PREFIX_CACHE, GATEWAY, [(1, (2000, 24000)), (8, (2000, 24000))])
    lines = skeptic.verdict("qwen3-32b", entry)
    assert len(lines) == 2
    assert "1 conversation at 24,000" in lines[0] and "Boomerang does not win here" in lines[0]
    assert "8 conversations at 24,000" in lines[1] and "Boomerang wins" in lines[1]
    assert "about what recomputing costs" in lines[1] and "evicted" in lines[1]
    console = Console(record=True, width=200)
    console.print(skeptic.table("qwen3-32b", entry, GATEWAY, 96_000))
    text = console.export_text()
    assert "656 (3%)" in text and "Boomerang" in text and "96,000 tokens" in text
    measured = [("qwen3-32b", {"gateway": report.rows(result, "qwen3-32b", (2000, 24000), "gateway"),
                               "prefix-cache": report.rows(result, "qwen3-32b", (2000, 24000), "prefix-cache")})]
    path = tmp_path / "c.png"
    report.chart(measured, [GATEWAY, PREFIX_CACHE], path,
                 {"qwen3-32b": lambda ax: skeptic.panel(ax, "qwen3-32b", entry, GATEWAY, 96_000)})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
