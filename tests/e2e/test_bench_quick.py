"""`boomerang bench --quick`, scaled down: the harness runs end to end and writes a report of
the promised shape. Not a timed test: the performance goals live in the report itself."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import asyncpg
import pytest
from boomerang_tools.bench.report import TARGETS

from tests.conftest import ADMIN_URL
from tests.support.procs import BOOMERANG, ROOT

pytestmark = pytest.mark.e2e


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


async def test_quick_bench_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [BOOMERANG, "bench", "--quick", "--leases", "2000", "--step-seconds", "1", "--clients", "2",
           "--expiry-leases", "400", "--expiry-window", "2", "--gateway-seconds", "2", "--register-seconds", "1",
           "--out", str(out), "--data-dir", str(tmp_path / "data")]
    env = {**os.environ, "BOOMERANG_DATABASE_URL": ADMIN_URL}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    report = json.loads((out / "bench-report.json").read_text())
    # The shape.
    plan = report["plan"]
    assert plan["leases"] == 2000
    assert [r["rate"] for r in plan["rates"]] == [500, 1000, 2000]
    for step in [plan["low_rate"], *plan["rates"], *plan["search"]]:
        assert all(_number(step[k]) for k in ("p50_ms", "p99_ms", "p999_ms")), step
        assert step["p50_ms"] <= step["p99_ms"] <= step["p999_ms"]
        assert step["plans"] > 0 and set(step["cpu_ms_per_plan"]) >= {"router", "registry", "postgres", "clients"}
    assert isinstance(plan["max_rps_p99_5ms"], int)
    steps = [plan["low_rate"], *plan["rates"], *plan["search"]]
    assert plan["max_rps_p99_5ms"] in {0, *(s["rate"] for s in steps if s["meets_p99_budget"])}
    assert plan["grpc_floor"]["calls"] > 0 and plan["cpu_cost"]["services_cpu_ms"] > 0
    # The plans really verified preloaded prefixes and pulled (the workload matches its leases).
    assert sum(s["reasons"].get("VERIFIED_PREFIX", 0) for s in plan["rates"]) > 0, plan["rates"]
    assert _number(report["register_rps"]) and report["register_rps"] > 0
    assert report["register"]["outcomes"].get("created", 0) > 0
    assert _number(report["expiry_lag_p99_s"])
    assert report["expiry"]["expired"] == 400 and report["expiry"]["expired_early"] == 0
    gw = report["gateway_overhead"]
    assert {"boomerang_p50_ms", "naive_p50_ms", "ratio"} <= set(gw)
    assert _number(gw["boomerang_p50_ms"]) and _number(gw["naive_p50_ms"])
    paths = ("direct", "naive", "boomerang", "direct-hook", "naive-hook", "hook")
    assert all(gw["turn_ms"][p]["count"] > 0 for p in paths), gw["turn_ms"]
    assert _number(gw["hook_p50_ms"]) and _number(gw["naive_hook_p50_ms"])
    # Hook mode: the engines planned (and pulled), the gateway only routed.
    hook = report["control_plane_hook"]
    assert hook["engine_plans"].get("pull", 0) > 0 and hook["sequential_errors"] == {}, hook
    assert hook["cpu_ms_per_turn_total"] > 0 and {"gateway-hook", "router", "registry", "postgres"} <= set(hook["cpu_ms_per_turn"])
    assert gw["errors"] == {}
    # The agents phase read the services' own counters of plans made without reuse (a dict of
    # `service:cause` → count, empty when every plan had its claim answered).
    degraded = report["control_plane"]["agents_degraded_by"]
    assert isinstance(degraded, dict) and all(k.split(":")[0] in ("gateway", "router") and v > 0
                                              for k, v in degraded.items()), degraded
    assert [s["leases"] for s in report["scale"]] == [200, 2000]
    assert all(_number(s["db_size_mb"]) and _number(s["p99_ms"]) for s in report["scale"])
    assert {"registry", "router", "reaper", "gateway", "naive-proxy"} <= set(report["memory_mb"])
    assert all(v > 0 for v in report["memory_mb"].values())
    assert set(report["targets"]) == set(TARGETS)
    assert {"hook_overhead_ratio", "hook_turn_cpu_ms", "turn_cpu_ms", "gateway_overhead_ratio"} <= set(TARGETS)
    md = (out / "bench-report.md").read_text()
    assert "## Targets" in md

    # The scratch database is gone.
    conn = await asyncpg.connect(ADMIN_URL)
    try:
        assert not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", report["database"]["name"])
    finally:
        await conn.close()
