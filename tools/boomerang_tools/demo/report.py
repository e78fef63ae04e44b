"""The demo's outputs: each profile's table beside its reference (AWS's published figures, or
the H200's measured ones), `demo-report.json`, and a PNG chart.

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


def _reference_columns(source: str) -> tuple[str, str, str]:
    if source == "AWS":
        return "AWS off", "AWS on", "AWS speedup"
    return f"{source} recompute", f"{source} pulled turn", f"{source} ceiling"


def table(profile: str, by_mode: dict[str, list[dict[str, Any]]], modes: list[Mode],
          plans: dict[str, dict[int, str]] | None = None) -> Table:
    """The measured table, one TTFT-on and speedup column per mode, the simulator's own ceiling
    at each point, and the reference's figures beside it (AWS's published TTFTs, or the H200's
    measured recompute, pulled turn and their ratio), and what each mode's measured turns took
    from the decode engine."""
    p = sim_profile(profile)
    ref = p.reference
    t = Table(title=f"{p.served_model_name} ({profile}): time to first token, Boomerang off vs on",
              title_justify="left", header_style="bold")
    for col in ("context", "TTFT off"):
        t.add_column(col, justify="right")
    for mode in modes:
        t.add_column(f"on: {mode.label}" if mode.boomerang else f"{mode.label} (no Boomerang)", justify="right")
        t.add_column("speedup", justify="right")
    t.add_column("ceiling", justify="right")
    for col in _reference_columns(ref.source):
        t.add_column(col, justify="right", style="dim")
    for mode in modes if plans is not None else []:
        t.add_column(f"{'pulled' if mode.boomerang else 'P cache hits'}: {mode.label}", justify="right")
    published = ref.points()
    by_point = {m.name: {r["context_tokens"]: r for r in by_mode.get(m.name, [])} for m in modes}
    points = sorted({r["context_tokens"] for rows_ in by_mode.values() for r in rows_})
    for point in points:
        aws = published.get(point)
        cells = []
        for mode in modes:
            row = by_point[mode.name].get(point)
            cells += [f"{row['ttft_on_ms']:,.0f} ms", _speedup_cell(row)] if row else ["—", "—"]
        off = next((by_point[m.name][point]["ttft_off_ms"] for m in modes if point in by_point[m.name]), None)
        ceiling = next((by_point[m.name][point]["ceiling_speedup"] for m in modes
                        if "ceiling_speedup" in by_point[m.name].get(point, {})), None)
        t.add_row(
            f"{point:,}",
            f"{off:,.0f} ms" if off is not None else "—",
            *cells,
            f"{ceiling:.2f}×" if ceiling is not None else "—",
            *((f"{aws[0]:,.0f} ms", f"{aws[1]:,.0f} ms", f"{aws[2]:.2f}×") if aws else ("—", "—", "—")),
            *([plans.get(m.name, {}).get(point, "—") for m in modes] if plans is not None else []),
        )
    if p.published is not None:
        said = f"AWS reports a best speedup of {p.published.speedup}× at the longest context."
    else:
        said = ("H200: one GPU, measured (P's side: a full prefill against the copy at 55 GB/s and the new "
                "turn's prefill; the simulated TTFT adds D's load of the prompt and its first step to both).")
    t.caption = (f"{said} ceiling: the simulator's own cost model's speedup for these turns with nothing but the "
                 "engines costing time; in brackets, the share of it each mode reached.")
    return t


def _speedup_cell(row: dict[str, Any]) -> str:
    share = row.get("share_of_ceiling")
    return f"[bold]{row['speedup']:.2f}×[/bold]" + (f" ({share:.0%})" if share is not None else "")


# Issue 25: at every point AWS published, the share of the simulator's own ceiling speedup.
CEILING_TARGETS = {"hook": 0.95, "gateway": 0.90}


def ceiling_targets(profiles: list[Measured]) -> dict[str, Any]:
    """Each mode with a target: its lowest share of the ceiling over the reference's points,
    the points below the target, and whether the target is met (None: nothing measured)."""
    out: dict[str, Any] = {}
    for mode, goal in CEILING_TARGETS.items():
        shares = {f"{name} {row['context_tokens']:,}": row["share_of_ceiling"]
                  for name, by_mode in profiles for row in by_mode.get(mode, [])
                  if row["context_tokens"] in sim_profile(name).reference.points()
                  and "share_of_ceiling" in row}
        if shares:
            out[mode] = {"target": goal, "lowest": min(shares.values()), "met": min(shares.values()) >= goal,
                         "below": {k: v for k, v in shares.items() if v < goal}}
    return out


COLORS = ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e")  # one per mode, in order


def chart(profiles: list[Measured], modes: list[Mode], path: Path,
          lower: dict[str, Callable[[Any], list[tuple[float, float, str, str]]]] | None = None) -> None:
    """TTFT against context length, off and on in every mode, with the reference's points (AWS's
    published, or the H200's measured) and the ceiling, one panel per profile; `lower` draws a
    second panel under a profile's (given its axes; it returns the labels to place)."""
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

    placed: dict[Any, list[tuple[float, float, str, str]]] = {}
    nrows = 2 if lower else 1
    fig, axes = plt.subplots(nrows, len(profiles), figsize=(6.2 * len(profiles), 4.6 * nrows), squeeze=False)
    for ax, (name, by_mode) in zip(axes[0], profiles):
        p = sim_profile(name)
        first = next((by_mode[m.name] for m in modes if by_mode.get(m.name)), [])
        ax.plot([r["context_tokens"] / 1000 for r in first], [r["ttft_off_ms"] for r in first], "o-", color="#c0392b",
                label="Boomerang off (recompute)")
        labels: list[tuple[float, float, str, str]] = []
        capped = [r for r in first if r.get("ceiling_speedup")]
        if capped:
            cx = [r["context_tokens"] / 1000 for r in capped]
            ax.plot(cx, [r["ttft_off_ms"] / r["ceiling_speedup"] for r in capped], ":", color="#555555", lw=1.5,
                    label="ceiling (the cost model: nothing but the engines)")
            labels.append((cx[-1], capped[-1]["ttft_off_ms"] / capped[-1]["ceiling_speedup"],
                           f"ceiling {capped[-1]['ceiling_speedup']:.2f}×", "#555555"))
        for i, mode in enumerate(modes):
            data = by_mode.get(mode.name, [])
            if not data:
                continue
            color = COLORS[i % len(COLORS)]
            xs = [r["context_tokens"] / 1000 for r in data]
            ax.plot(xs, [r["ttft_on_ms"] for r in data], "o-" if mode.boomerang else "s--", color=color,
                    label=f"Boomerang on: {mode.label}" if mode.boomerang else f"{mode.label} + sticky (no Boomerang)")
            labels.append((xs[-1], data[-1]["ttft_on_ms"], f"{data[-1]['speedup']:.2f}×", color))
        ref = p.reference
        px = [n / 1000 for n in ref.contexts]
        what = "published" if ref.source == "AWS" else "measured, P's side"
        ax.plot(px, ref.off_ms, "s--", color="#c0392b", mfc="none", ms=9, alpha=0.6, label=f"{ref.source} off ({what})")
        ax.plot(px, ref.on_ms, "s--", color="#1f77b4", mfc="none", ms=9, alpha=0.6, label=f"{ref.source} on ({what})")
        ax.set_title(f"{p.served_model_name}")
        frame(ax, max([r["context_tokens"] / 1000 for r in first] + px), 8)
        placed[ax] = labels
    for ax, (name, _) in zip(axes[1] if lower else [], profiles):
        draw = (lower or {}).get(name)
        if draw is not None:
            placed[ax] = draw(ax)
        else:
            ax.set_visible(False)
    fig.suptitle("Boomerang: KV-cache reuse in P/D disaggregated serving (simulated engines)", fontsize=12)
    fig.tight_layout()
    for ax, labels in placed.items():
        place_labels(ax, labels)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def frame(ax: Any, right: float, legend_size: float) -> None:
    """A panel's axes: TTFT against context from 0, up to `right` thousand tokens (and room
    past it for the labels right of the lines' ends), gridded, the legend top left."""
    ax.set_xlabel("context length (thousand tokens)")
    ax.set_ylabel("time to first token (ms)")
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0, right=right * 1.34)
    ax.set_xticks([t for t in ax.get_xticks() if 0 <= t <= right])
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=legend_size, loc="upper left")


def spread(wanted: list[float], gap: float) -> list[float]:
    """Positions as near `wanted` as they can be with at least `gap` between any two (same
    units, one axis), keeping their order: each cluster of labels too close together is
    spread evenly around its own middle."""
    order = sorted(range(len(wanted)), key=lambda i: wanted[i])
    groups: list[list[int]] = []
    for i in order:
        groups.append([i])
        while len(groups) > 1:
            low, high = groups[-2], groups[-1]
            low_top = _centre(wanted, low) + gap * (len(low) - 1) / 2
            high_bottom = _centre(wanted, high) - gap * (len(high) - 1) / 2
            if high_bottom - low_top >= gap:
                break
            groups[-2:] = [low + high]
    out = [0.0] * len(wanted)
    for group in groups:
        bottom = _centre(wanted, group) - gap * (len(group) - 1) / 2
        for k, i in enumerate(group):
            out[i] = bottom + k * gap
    return out


def _centre(wanted: list[float], group: list[int]) -> float:
    return sum(wanted[i] for i in group) / len(group)


def place_labels(ax: Any, labels: list[tuple[float, float, str, str]], fontsize: float = 9.5) -> None:
    """Write each (x, y, text, colour) label to the right of its point (the lines end there:
    the chart leaves room), moved apart vertically in screen space so that no two overlap."""
    if not labels:
        return
    to_screen = ax.transData.transform
    points = [to_screen((x, y)) for x, y, _, _ in labels]
    dpi_scale = ax.figure.dpi / 72  # points to pixels
    gap = fontsize * 1.5 * dpi_scale
    wanted = [py + 12 * dpi_scale for _, py in points]
    for (x, y, text, color), (_, py), ty in zip(labels, points, spread(wanted, gap)):
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(12, (ty - py) / dpi_scale), ha="left",
                    va="center", fontsize=fontsize, fontweight="bold", color=color,
                    arrowprops={"arrowstyle": "-", "color": color, "lw": 0.6, "alpha": 0.6})
