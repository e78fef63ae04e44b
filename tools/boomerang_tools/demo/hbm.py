"""The demo's HBM comparison: decode memory under vLLM's fixed TTL and under Boomerang's
releases, on the same conversations (tools/boomerang_tools/sim/hbm.py, in simulated time:
the pauses are minutes long, the replay takes seconds)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from boomerang_tools.sim.hbm import HbmResult, HbmWorkload, compare

# The targets, checked on every run.
MAX_BLOCK_SECONDS_SHARE = 0.20
MIN_PULLS_KEPT = 0.98


def figures(fixed: HbmResult, boomerang: HbmResult) -> dict[str, Any]:
    """The comparison's figures and whether each target holds."""
    share = boomerang.block_seconds / fixed.block_seconds if fixed.block_seconds else 0.0
    kept = boomerang.pulls / fixed.pulls if fixed.pulls else 1.0
    return {
        "policies": {r.policy: {**asdict(r), "pull_share": round(r.pull_share, 4)} for r in (fixed, boomerang)},
        "block_seconds_share": round(share, 4),
        "pulls_kept": round(kept, 4),
        "targets_met": share <= MAX_BLOCK_SECONDS_SHARE and kept >= MIN_PULLS_KEPT and boomerang.bad_reads == 0,
    }


def run_hbm(console: Console, out: Path, quick: bool = False) -> dict[str, Any]:
    """Run both policies, print them side by side, write `demo-hbm.json`; the figures."""
    workload = replace(HbmWorkload(), conversations=200) if quick else HbmWorkload()
    with console.status("HBM: replaying conversations against one decode engine's KV pool…"):
        fixed, boomerang = compare(workload)
    got = figures(fixed, boomerang)
    tenants = ", ".join(f"{t.name} (pause median {t.pause_median_s:g} s)" for t in workload.tenants)
    console.rule("[bold]Decode memory[/bold]: fixed TTL vs Boomerang's release")
    console.print(
        f"{workload.conversations} conversations ({tenants}; {workload.end_probability:.0%} end after each turn, "
        f"{workload.recompute_share:.0%} of next turns recomputed) on one decode engine of "
        f"{workload.pool_blocks:,} KV blocks; vLLM's TTL {workload.ttl_s:g} s."
    )
    table = Table()
    for col in ("", "fixed TTL", "Boomerang"):
        table.add_column(col, justify="right" if col else "left")
    rows = (
        ("retained block-seconds", f"{fixed.block_seconds:,.0f}", f"{boomerang.block_seconds:,.0f} ({got['block_seconds_share']:.0%})"),
        ("peak retained blocks", f"{fixed.peak_retained_blocks:,}", f"{boomerang.peak_retained_blocks:,}"),
        ("PULL share of next turns", f"{fixed.pull_share:.1%}", f"{boomerang.pull_share:.1%} ({got['pulls_kept']:.1%} of the PULLs kept)"),
        ("requests that waited for memory", f"{fixed.waited:,}", f"{boomerang.waited:,}"),
        ("reads of a released block", f"{fixed.bad_reads}", f"{boomerang.bad_reads}"),
        ("releases by reason", _reasons(fixed), _reasons(boomerang)),
        ("reuse lost to an early release", "—", f"{boomerang.lost_to_release:,}"),
    )
    for row in rows:
        table.add_row(*row)
    console.print(table)
    verdict = "[green]met[/green]" if got["targets_met"] else "[red]NOT met[/red]"
    console.print(f"Targets (block-seconds ≤ {MAX_BLOCK_SECONDS_SHARE:.0%}, ≥ {MIN_PULLS_KEPT:.0%} of PULLs kept, "
                  f"no read of a released block): {verdict}.")
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo-hbm.json").write_text(json.dumps({"workload": asdict(workload), **got}, indent=2, default=str))
    return got


def _reasons(r: HbmResult) -> str:
    return ", ".join(f"{k.lower()} {v:,}" for k, v in sorted(r.released.items())) or "—"
