"""`boomerang demo --quick` end to end: the whole system comes up in each deployment (the
gateway planning, and the engines' vLLM hook planning), the table has AWS's shape in both
(speedup growing with context, large at the longest), the report has one entry per profile
and mode, nothing failed and nothing corrupt was pulled, and no engine was asked to tokenize
(the hook plans from the engine's own ids; the gateway tokenizes in-process with the
simulator's model files, as the bench's gateway does). The skeptic's alternative (no Boomerang: prefix caching on the prefill
engine, sticky routing; --quick: the first profile) behaves as modelled: with one
conversation P's cache holds it and beats recomputing and Boomerang; with eight long ones
sharing P they evict each other and Boomerang wins. Boomerang off is off whichever modes are
chosen: each mode alone measures the same baseline, every prompt recomputed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from boomerang_tools.demo.modes import MODES
from boomerang_tools.demo.workload import QUICK_POINTS
from boomerang_tools.sim.costmodel import profile as sim_profile

from tests.support.databases import fresh_database
from tests.support.gateway_stack import BOOMERANG

pytestmark = pytest.mark.e2e


# One of AWS's profiles (its published columns and the prefix-cache comparison) and one of the
# H200's (its measured columns): `make demo` runs all four.
QUICK_PROFILES = ("qwen3-32b", "qwen3-32b-h200")


@pytest.mark.timeout(900)
def test_quick_demo(tmp_path: Path) -> None:
    with fresh_database() as database_url:
        _quick_demo(database_url, tmp_path)


def _quick_demo(database_url: str, tmp_path: Path) -> None:
    run = subprocess.run(
        [BOOMERANG, "demo", "--quick", "--profiles", ",".join(QUICK_PROFILES), "--database-url", database_url,
         "--out", str(tmp_path), "--data-dir", str(tmp_path / ".boomerang")],
        capture_output=True, text=True, timeout=900, env={"PATH": "/usr/bin:/bin", "BOOMERANG_DB_POOL_SIZE": "3",
                                                          "COLUMNS": "160"},
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = json.loads((tmp_path / "demo-report.json").read_text())
    assert set(report) == {"profiles", "ceiling_targets", "corrupt_pulls", "requests_failed", "off",
                           "first_turn_delta_ms"}
    # A first turn's TTFT with Boomerang on less off, per mode that plans and profile.
    firsts = report["first_turn_delta_ms"]
    assert {"gateway", "hook"} <= set(firsts) and all(set(v) == set(QUICK_PROFILES) for v in firsts.values())
    turns = sum(1 + 2 * len(QUICK_POINTS[p]) for p in QUICK_PROFILES)
    assert report["off"] == {"turns": turns, "cached_tokens": 0, "pulls": 0}
    # Issue 25's demo targets, per mode, against the simulator's own ceiling (met or not depends
    # on the host: the figures are the report's, the shape is the test's).
    assert set(report["ceiling_targets"]) == {"gateway", "hook"}
    for target in report["ceiling_targets"].values():
        assert 0 < target["lowest"] and target["met"] == (target["lowest"] >= target["target"])
        assert all(share < target["target"] for share in target["below"].values())
    assert report["corrupt_pulls"] == 0 and report["requests_failed"] == 0
    assert [(p["profile"], p["mode"]) for p in report["profiles"]] == [
        ("qwen3-32b", "gateway"), ("qwen3-32b", "gateway-no-id"), ("qwen3-32b", "hook"),
        ("qwen3-32b", "prefix-cache"),
        ("qwen3-32b-h200", "gateway"), ("qwen3-32b-h200", "gateway-no-id"), ("qwen3-32b-h200", "hook")]
    boomerang = [p for p in report["profiles"] if p["mode"] != "prefix-cache"]
    for profile in boomerang:
        assert {"profile", "mode", "rows", "tokenize_calls", "pulls"} <= set(profile)
        turns_on = 1 + 2 * len(QUICK_POINTS[profile["profile"]])
        # Nothing asks P's /tokenize: the gateway tokenizes in-process (BOOMERANG_TOKENIZERS, set
        # by the demo's stack), and with the hook the engines plan from their own token ids.
        assert profile["tokenize_calls"] == 0, profile
        if profile["mode"] not in ("gateway", "gateway-no-id"):
            assert profile["engine_plan_ms_p50"] > 0
        # Turns after the first pull (a busy machine may turn a few into recomputes).
        assert len(QUICK_POINTS[profile["profile"]]) <= profile["pulls"] <= turns_on - 1, profile
        rows = profile["rows"]
        assert [r["context_tokens"] for r in rows] == list(QUICK_POINTS[profile["profile"]])
        for row in rows:
            assert set(row) == {"context_tokens", "ttft_off_ms", "ttft_on_ms", "speedup", "ceiling_speedup",
                                "share_of_ceiling"}
            assert abs(row["speedup"] - row["ttft_off_ms"] / row["ttft_on_ms"]) < 0.011  # rounded separately
            # The ceiling pulls the whole previous turn: it always gains, and most at the longest context.
            assert row["ceiling_speedup"] > 1
            assert abs(row["share_of_ceiling"] - row["ttft_off_ms"] / row["ttft_on_ms"] / row["ceiling_speedup"]) < 0.01
        # AWS's shape, in the simulator's own model: recomputing grows with the context much
        # faster than pulling does.
        assert rows[-1]["ceiling_speedup"] > rows[0]["ceiling_speedup"]
        assert rows[-1]["ttft_off_ms"] > 3 * rows[0]["ttft_off_ms"], run.stdout
    # What the measured speedups reach depends on the host: Boomerang's path is CPU work on the
    # same two cores as the simulated engines, and at load 15 the gateway's speedup at 24k came
    # out 0.99×. `make demo` reports them against the ceiling; the test asserts what holds on any
    # host: with the engines planning (no extra hop), pulling the longest context still beats
    # recomputing it.
    for profile in (p for p in boomerang if p["mode"] == "hook"):
        assert profile["rows"][-1]["speedup"] > 1, run.stdout
    _prefix_cache(report, run.stdout)
    assert (tmp_path / "demo-report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = run.stdout
    # The audit trail is read over gRPC from the running router and registry (issue 22).
    assert "AWS off" in out and "Audit trail" in out and "ListTurnPlans" in out and "OK" in out
    assert "audit trail unavailable" not in out
    assert "on: gateway" in out and "on: engine hook" in out


def _prefix_cache(report: dict[str, Any], out: str) -> None:
    """The third mode's entry: its rows, and where it wins and loses against Boomerang."""
    (entry,) = [p for p in report["profiles"] if p["mode"] == "prefix-cache"]
    gateway = next(p for p in report["profiles"] if p["profile"] == entry["profile"] and p["mode"] == "gateway")
    assert entry["profile"] == "qwen3-32b" and entry["pulls"] == 0 and entry["tokenize_calls"] == 0
    assert entry["prefix_cache_capacity_tokens"] == 96_000 and entry["prefix_cache_hit_tokens"] > 0
    assert entry["prefix_cache_evicted_blocks"] > 0  # eight conversations of 24k do not fit
    points = list(QUICK_POINTS["qwen3-32b"])
    assert [r["context_tokens"] for r in entry["rows"]] == points
    # One conversation: P's cache holds it, so every measured turn beats recomputing it.
    for row in entry["rows"]:
        assert set(row) == {"context_tokens", "ttft_off_ms", "ttft_on_ms", "speedup"}
        assert row["ttft_on_ms"] < row["ttft_off_ms"], out
    assert [(lv["conversations"], [r["context_tokens"] for r in lv["rows"]]) for lv in entry["concurrency"]] == [
        (1, points), (8, points[-1:])]
    one, eight = (lv["rows"] for lv in entry["concurrency"])
    for row in one:
        assert row["cached_share"] >= 0.9 and row["ttft_off_ms"] == next(
            r["ttft_off_ms"] for r in gateway["rows"] if r["context_tokens"] == row["context_tokens"])
    # Where Boomerang does not win: one conversation at the longest context (no transfer needed).
    assert one[-1]["ttft_prefix_cache_ms"] < one[-1]["ttft_boomerang_ms"] and one[-1]["faster"] == "prefix-cache", out
    # Where it wins: eight conversations of 24k evict each other from P's 96k-token cache,
    # while the decode engine still holds each one's last turn.
    (longest,) = eight
    assert longest["cached_share"] < 0.1, out
    assert longest["ttft_boomerang_ms"] < longest["ttft_prefix_cache_ms"] and longest["faster"] == "boomerang", out
    assert longest["ttft_prefix_cache_ms"] > 0.8 * longest["ttft_off_ms"], out
    flat = " ".join(out.split())  # rich wraps lines
    assert "prefix caching on the prefill engine with sticky routing" in flat
    assert "Boomerang does not win here" in flat and "Boomerang wins" in flat


@pytest.mark.parametrize("mode", [m.name for m in MODES])
def test_off_recomputes_every_prompt_whichever_mode_runs_alone(mode: str, tmp_path: Path) -> None:
    # Issue 33: `--modes hook` alone measured "off" through the engines' hook, which pulled.
    with fresh_database() as database_url:
        run = subprocess.run(
            [BOOMERANG, "demo", "--quick", "--hbm", "off", "--profiles", "qwen3-32b", "--modes", mode,
             "--database-url", database_url, "--out", str(tmp_path), "--data-dir", str(tmp_path / ".boomerang")],
            capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "BOOMERANG_DB_POOL_SIZE": "3",
                                                              "COLUMNS": "160"},
        )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = json.loads((tmp_path / "demo-report.json").read_text())
    points = QUICK_POINTS["qwen3-32b"]
    # Every "off" turn computed its whole prompt: its engines pulled nothing, its usage shows no cached token.
    assert report["off"] == {"turns": 1 + 2 * len(points), "cached_tokens": 0, "pulls": 0}
    (entry,) = report["profiles"]
    assert entry["mode"] == mode and [r["context_tokens"] for r in entry["rows"]] == list(points)
    # And took what recomputing costs in the simulator's model (a pulled "off" took far less).
    model = sim_profile("qwen3-32b")
    for row in entry["rows"]:
        assert row["ttft_off_ms"] >= 0.95 * model.ttft_ms(row["context_tokens"]), (row, run.stdout[-3000:])
