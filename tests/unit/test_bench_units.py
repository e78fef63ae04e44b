"""The benchmark's pure parts: statistics, the synthetic workload, arrivals, report logic."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from boomerang.tokenchain import HASH_BYTES, build_chain, common_tokens
from boomerang_tools.bench.context import BenchConfig, summarize_collapsed
from boomerang_tools.bench.loadgen import schedule
from boomerang_tools.bench.report import _targets, clean, percentile, summarize
from boomerang_tools.bench.workload import (
    BLOCK_SIZE,
    NEW_TOKENS,
    chain_for,
    conversation,
    next_prompt,
    planned_indices,
    retained_tokens,
)


def test_percentiles_are_nearest_rank_on_raw_samples() -> None:
    values = list(range(1, 1001))
    assert percentile(values, 50) == 500 and percentile(values, 99) == 990 and percentile(values, 99.9) == 999
    assert percentile([7.0], 99.9) == 7.0
    assert math.isnan(percentile([], 50))
    s = summarize([3.0, 1.0, 2.0])
    assert (s["count"], s["p50_ms"], s["max_ms"], s["mean_ms"]) == (3, 2.0, 3.0, 2.0)
    assert clean({"a": [math.nan, 1.0, math.inf]}) == {"a": [None, 1.0, None]}


def test_a_planned_conversation_s_next_prompt_verifies_against_its_lease() -> None:
    for k in (0, 2, 1234, 99_998):
        c = conversation(k, tenants=1000, engines=8)
        assert c.planned and c.tenant == f"bench-t{k % 1000:04d}" and c.engine == k % 8
        lease = chain_for(c)
        prompt = next_prompt(c)
        assert prompt[: c.num_tokens] == retained_tokens(c) and len(prompt) == c.num_tokens + NEW_TOKENS
        # The registry's check: the whole blocks of the lease are a verified prefix of the prompt.
        assert common_tokens(lease, build_chain(prompt, BLOCK_SIZE)) == c.num_tokens // BLOCK_SIZE * BLOCK_SIZE


def test_filler_chains_have_the_shape_of_real_ones() -> None:
    c = conversation(7, tenants=10, engines=2)
    assert not c.planned
    filler, real = chain_for(c), build_chain(retained_tokens(c), BLOCK_SIZE)
    assert len(filler.block_hashes) == len(real.block_hashes) == c.num_tokens // BLOCK_SIZE * HASH_BYTES
    assert len(filler.tail_hash) == len(real.tail_hash)
    filler.validate()
    assert planned_indices(3, 11) == [4, 6, 8, 10]


def test_poisson_arrivals_hold_the_rate_and_the_limit() -> None:
    offsets = schedule(1000.0, 10.0, seed=1, limit=10**6)
    assert 9500 < len(offsets) < 10500
    assert offsets == sorted(offsets) and 0 < offsets[0] and offsets[-1] < 10.0
    assert len(schedule(1000.0, 10.0, seed=1, limit=50)) == 50


def test_quick_and_full_runs_and_their_scale_tiers() -> None:
    full, quick = BenchConfig.for_run(False), BenchConfig.for_run(True)
    assert full.scale_tiers == [10_000, 100_000, 1_000_000] and full.rates == [500, 1000, 2000]
    assert quick.scale_tiers == [10_000, 100_000] and quick.step_seconds < full.step_seconds
    assert BenchConfig.for_run(True, leases=2000).scale_tiers == [200, 2000]


def test_collapsed_stacks_summarise_into_self_and_inclusive_shares() -> None:
    text = ("main (a.py:1);serve (b.py:2);claim (c.py:3) 6\n"
            "main (a.py:1);serve (b.py:2) 3\n"
            "main (a.py:1);idle (d.py:9) 1\n")
    out = summarize_collapsed(text)
    assert out["samples"] == 10
    assert out["self"][0] == {"function": "claim (c.py)", "percent": 60.0}
    inclusive = {x["function"]: x["percent"] for x in out["inclusive"]}
    assert inclusive["main (a.py)"] == 100.0 and inclusive["serve (b.py)"] == 90.0


def test_targets_are_judged_against_the_issue_s_goals() -> None:
    report = {
        "plan": {"rates": [{"rate": 1000, "p50_ms": 0.9, "p99_ms": 5.5}], "max_rps_p99_5ms": 3000},
        "register_rps": 4999.0,
        "expiry_lag_p99_s": 1.0,
        "gateway_overhead": {"ratio": None},
        "hook_schedule": {"far": {"background": {"max_ms": 0.4}}},
        "first_turns": {"2000/gateway/id": {"delta_p50_ms": 0.2}, "24000/hook/no id": {"delta_p50_ms": 0.9}},
    }
    met = {k: v["met"] for k, v in _targets(report).items()}
    assert met == {"plan_p50_ms_at_1000": True, "plan_p99_ms_at_1000": False, "max_rps_p99_5ms": True,
                   "register_rps": False, "register_batched_rps": False, "expiry_lag_p99_s": True,
                   "gateway_overhead_ratio": False, "hook_overhead_ratio": False, "plan_pull_at_1000": False,
                   "plan_cpu_ratio": False, "turn_cpu_ms": False, "hook_turn_cpu_ms": False,
                   "agents_pull_share": False, "agents_failed": False, "hook_step_max_ms_far": True,
                   "lookup_p50_delta_ms": False, "lookup_cpu_ratio": False, "first_turn_delta_ms": True}
    report["hook_schedule"]["far"]["background"]["max_ms"] = 1.2
    assert not _targets(report)["hook_step_max_ms_far"]["met"]
    report["first_turns"]["24000/hook/no id"]["delta_p50_ms"] = 1.3  # the worst of them judges
    assert not _targets(report)["first_turn_delta_ms"]["met"]


def test_issue_13_targets_side_by_side() -> None:
    report = {
        "plan": {"rates": [{"rate": 1000, "p50_ms": 2.0, "p99_ms": 9.0, "pull_fraction": 0.995}],
                 "max_rps_p99_5ms": 0,
                 "cpu_cost": {"services_cpu_ms": 1.2},
                 "grpc_floor": {"server_cpu_ms_per_call": 0.4, "client_cpu_ms_per_call": 0.4}},
        "register_rps": 100.0, "expiry_lag_p99_s": 0.1, "gateway_overhead": {"ratio": 1.2},
        "control_plane": {"cpu_ms_per_turn_total": 6.5, "agents_pull_share": 0.96, "agents_failed": 0},
    }
    targets = _targets(report)
    assert targets["plan_cpu_ratio"]["value"] == 1.5 and targets["plan_cpu_ratio"]["met"]
    assert targets["plan_pull_at_1000"]["met"] and targets["agents_pull_share"]["met"]
    assert targets["agents_failed"]["met"] and not targets["turn_cpu_ms"]["met"]
    report["control_plane"]["agents_failed"] = 1
    assert not _targets(report)["agents_failed"]["met"]


def test_hook_mode_targets_beside_the_gateway_only_ones() -> None:
    report = {
        "plan": {"rates": [], "max_rps_p99_5ms": 0}, "register_rps": 100.0, "expiry_lag_p99_s": 0.1,
        "gateway_overhead": {"ratio": 1.6, "hook_ratio": 1.05},
        "control_plane": {"cpu_ms_per_turn_total": 5.0},
        "control_plane_hook": {"cpu_ms_per_turn_total": 3.2},
    }
    targets = _targets(report)
    assert not targets["gateway_overhead_ratio"]["met"] and targets["hook_overhead_ratio"]["met"]
    assert targets["turn_cpu_ms"]["met"] and not targets["hook_turn_cpu_ms"]["met"]
    assert (targets["hook_overhead_ratio"]["target"], targets["hook_turn_cpu_ms"]["target"]) == ("≤ 1.1", "≤ 3")
    report["gateway_overhead"]["hook_ratio"] = 1.2
    report["control_plane_hook"]["cpu_ms_per_turn_total"] = 2.9
    targets = _targets(report)
    assert not targets["hook_overhead_ratio"]["met"] and targets["hook_turn_cpu_ms"]["met"]




async def test_a_child_that_exits_before_it_is_ready_is_started_once_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first start dies at once (as a simulated engine once did between fork and exec);
    the second is ready. A child that dies every time still fails the run."""
    from boomerang_tools.bench.context import Services
    from boomerang_tools.stack import children
    from boomerang_tools.stack.children import ChildFailed

    marker = tmp_path / "started-once"
    script = ("import pathlib, sys, time\n"
              f"m = pathlib.Path({str(marker)!r})\n"
              "if sys.argv[1] == 'flaky' and not m.exists():\n"
              "    m.touch(); sys.exit(3)\n"
              "if sys.argv[1] == 'broken':\n"
              "    sys.exit(4)\n"
              "print('BOOMERANG_READY x 127.0.0.1:1', flush=True)\n"
              "time.sleep(30)\n")
    fake = tmp_path / "boomerang"
    fake.write_text(f"#!{sys.executable}\n{script}")
    fake.chmod(0o755)
    monkeypatch.setattr(children, "boomerang_script", lambda: fake)
    services = Services(tmp_path / "logs", {})
    try:
        services.start("flaky", ["flaky"])
        assert await services.ready("flaky", timeout=20) == ["127.0.0.1:1"]
        assert services.restarted == ["flaky"] and services.children["flaky"].alive()
        services.start("broken", ["broken"])
        with pytest.raises(ChildFailed):
            await services.ready("broken", timeout=20)
        assert services.restarted == ["flaky", "broken"]
    finally:
        services.stop()
