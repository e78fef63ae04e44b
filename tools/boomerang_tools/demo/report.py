"""The demo's outputs: AWS's table beside AWS's figures, `demo-report.json`, and a PNG chart.

Each profile is measured in every deployment (`modes.py`): the table has one TTFT-on and
speedup column per mode beside the shared TTFT-off, the chart one line per mode, and
`demo-report.json` one entry per profile and mode (`"mode": "gateway"`, `"hook"` or
`"prefix-cache"`; the last adds `concurrency`, see `skeptic.py`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.table import Table

from boomerang_tools.demo.modes import Mode
from boomerang_tools.demo.runner import RunResult
from boomerang_tools.sim.costmodel import profile as sim_profile

# One profile's measurements: its name, and its rows per mode name.
Measured = tuple[str, dict[str, list[dict[str, Any]]]]


def rows(result: RunResult, profile: str, points: tuple[int, ...], mode: str | None = None,
         ceiling: bool = True) -> list[dict[str, Any]]:
    """One row per measured context length (medians over repetitions), for one mode; with
    `ceiling` (a mode that pulls), its share of the simulator's own ceiling speedup."""
    out = []
    for point in points:
        off, on = result.ttft(profile, "off", point), result.ttft(profile, "on", point, mode)
        if off is None or on is None:
            continue
        row: dict[str, Any] = {
            "context_tokens": point,
            "ttft_off_ms": round(off, 1),
            "ttft_on_ms": round(on, 1),
            "speedup": round(off / on, 2) if on > 0 else 0.0,
        }
        best = result.ceiling(profile, point, mode) if mode is not None and ceiling else None
        if best is not None and on > 0:
            row["ceiling_speedup"] = round(best, 3)
            row["share_of_ceiling"] = round((off / on) / best, 3)
        out.append(row)
    return out


def report(profiles: list[Measured], corrupt_pulls: int, requests_failed: int, off: dict[str, int],
           extra: dict[tuple[str, str], dict[str, Any]] | None = None) -> dict[str, Any]:
    """`demo-report.json`'s content: one entry per profile and mode (`extra` adds fields to
    an entry, keyed by (profile, mode)), and what the baseline's turns computed (`off`)."""
    return {
        "profiles": [{"profile": name, "mode": mode, "rows": table, **(extra or {}).get((name, mode), {})}
                     for name, by_mode in profiles for mode, table in by_mode.items()],
        "ceiling_targets": ceiling_targets(profiles),
        "corrupt_pulls": corrupt_pulls,
        "requests_failed": requests_failed,
        "off": off,
    }


def write_json(data: dict[str, Any], path: Path) -> None:
    """Write the report."""
    path.write_text(json.dumps(data, indent=2) + "\n")


def _published(profile: str) -> dict[int, tuple[float, float, float]]:
    """AWS's (off, on, speedup) at its two published context lengths."""
    pub = sim_profile(profile).published
    return {n: (off, on, off / on) for n, off, on in zip(pub.contexts, pub.ttft_off_ms, pub.ttft_on_ms)}


def table(profile: str, by_mode: dict[str, list[dict[str, Any]]], modes: list[Mode],
          plans: dict[str, dict[int, str]] | None = None) -> Table:
    """The measured table, one TTFT-on and speedup column per mode, with AWS's figures beside
    it (and what each mode's measured turns took from the decode engine)."""
    p = sim_profile(profile)
    t = Table(title=f"{p.served_model_name} ({profile}): time to first token, Boomerang off vs on",
              title_justify="left", header_style="bold")
    for col in ("context", "TTFT off"):
        t.add_column(col, justify="right")
    for mode in modes:
        t.add_column(f"on: {mode.label}" if mode.boomerang else f"{mode.label} (no Boomerang)", justify="right")
        t.add_column("speedup", justify="right")
    for col in ("AWS off", "AWS on", "AWS speedup"):
        t.add_column(col, justify="right", style="dim")
    for mode in modes if plans is not None else []:
        t.add_column(f"{'pulled' if mode.boomerang else 'P cache hits'}: {mode.label}", justify="right")
    published = _published(profile)
    by_point = {m.name: {r["context_tokens"]: r for r in by_mode.get(m.name, [])} for m in modes}
    points = sorted({r["context_tokens"] for rows_ in by_mode.values() for r in rows_})
    for point in points:
        aws = published.get(point)
        cells = []
        for mode in modes:
            row = by_point[mode.name].get(point)
            cells += [f"{row['ttft_on_ms']:,.0f} ms", _speedup_cell(row)] if row else ["—", "—"]
        off = next((by_point[m.name][point]["ttft_off_ms"] for m in modes if point in by_point[m.name]), None)
        t.add_row(
            f"{point:,}",
            f"{off:,.0f} ms" if off is not None else "—",
            *cells,
            *((f"{aws[0]:,.0f} ms", f"{aws[1]:,.0f} ms", f"{aws[2]:.2f}×") if aws else ("—", "—", "—")),
            *([plans.get(m.name, {}).get(point, "—") for m in modes] if plans is not None else []),
        )
    t.caption = (f"AWS reports a best speedup of {p.published.speedup}× at the longest context. In brackets: the "
                 "share of the simulator's own ceiling (its cost model's speedup with nothing but the engines "
                 "costing time).")
    return t


def _speedup_cell(row: dict[str, Any]) -> str:
    share = row.get("share_of_ceiling")
    return f"[bold]{row['speedup']:.2f}×[/bold]" + (f" ({share:.0%})" if share is not None else "")


# Issue 25: at every point AWS published, the share of the simulator's own ceiling speedup.
CEILING_TARGETS = {"hook": 0.95, "gateway": 0.90}


def ceiling_targets(profiles: list[Measured]) -> dict[str, Any]:
    """Each mode with a target: its lowest share of the ceiling over AWS's published points,
    the points below the target, and whether the target is met (None: nothing measured)."""
    out: dict[str, Any] = {}
    for mode, goal in CEILING_TARGETS.items():
        shares = {f"{name} {row['context_tokens']:,}": row["share_of_ceiling"]
                  for name, by_mode in profiles for row in by_mode.get(mode, [])
                  if row["context_tokens"] in _published(name) and "share_of_ceiling" in row}
        if shares:
            out[mode] = {"target": goal, "lowest": min(shares.values()), "met": min(shares.values()) >= goal,
                         "below": {k: v for k, v in shares.items() if v < goal}}
    return out


COLORS = ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e")  # one per mode, in order


def chart(profiles: list[Measured], modes: list[Mode], path: Path,
          lower: dict[str, Callable[[Any], None]] | None = None) -> None:
    """TTFT against context length, off and on in every mode, with AWS's published points,
    one panel per profile; `lower` draws a second panel under a profile's (given its axes)."""
    try:
        # deferred: matplotlib (heavy, a dependency of the tools alone, and only for the
        # chart) loads only when a chart is drawn
        import matplotlib
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError("the demo's chart needs matplotlib: pip install -r requirements-tools.lock "
                                  "(`make setup` does)", name="matplotlib") from exc

    matplotlib.use("Agg")
    # deferred: pyplot after the backend is chosen
    import matplotlib.pyplot as plt

    nrows = 2 if lower else 1
    fig, axes = plt.subplots(nrows, len(profiles), figsize=(6.2 * len(profiles), 4.6 * nrows), squeeze=False)
    for ax, (name, by_mode) in zip(axes[0], profiles):
        p = sim_profile(name)
        first = next((by_mode[m.name] for m in modes if by_mode.get(m.name)), [])
        ax.plot([r["context_tokens"] / 1000 for r in first], [r["ttft_off_ms"] for r in first], "o-", color="#c0392b",
                label="Boomerang off (recompute)")
        for i, mode in enumerate(modes):
            data = by_mode.get(mode.name, [])
            if not data:
                continue
            color = COLORS[i % len(COLORS)]
            xs = [r["context_tokens"] / 1000 for r in data]
            ax.plot(xs, [r["ttft_on_ms"] for r in data], "o-" if mode.boomerang else "s--", color=color,
                    label=f"Boomerang on: {mode.label}" if mode.boomerang else f"{mode.label} + sticky (no Boomerang)")
            last = data[-1]
            ax.annotate(f"{last['speedup']:.2f}×", (xs[-1], last["ttft_on_ms"]), textcoords="offset points",
                        xytext=(-10, 12 + 14 * i), ha="right", fontsize=10, fontweight="bold", color=color)
        pub = p.published
        px = [n / 1000 for n in pub.contexts]
        ax.plot(px, pub.ttft_off_ms, "s--", color="#c0392b", mfc="none", ms=9, alpha=0.6, label="AWS off (published)")
        ax.plot(px, pub.ttft_on_ms, "s--", color="#1f77b4", mfc="none", ms=9, alpha=0.6, label="AWS on (published)")
        ax.set_title(f"{p.served_model_name}")
        ax.set_xlabel("context length (thousand tokens)")
        ax.set_ylabel("time to first token (ms)")
        ax.set_ylim(bottom=0)
        ax.set_xlim(left=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    for ax, (name, _) in zip(axes[1] if lower else [], profiles):
        draw = (lower or {}).get(name)
        if draw is not None:
            draw(ax)
        else:
            ax.set_visible(False)
    fig.suptitle("Boomerang: KV-cache reuse in P/D disaggregated serving (simulated engines)", fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
