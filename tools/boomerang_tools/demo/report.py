"""The demo's outputs: AWS's table beside AWS's figures, `demo-report.json`, and a PNG chart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.table import Table

from boomerang_tools.demo.runner import RunResult
from boomerang_tools.sim.costmodel import profile as sim_profile


def rows(result: RunResult, profile: str, points: tuple[int, ...]) -> list[dict[str, Any]]:
    """One row per measured context length (medians over repetitions)."""
    out = []
    for point in points:
        off, on = result.ttft(profile, "off", point), result.ttft(profile, "on", point)
        if off is None or on is None:
            continue
        out.append({
            "context_tokens": point,
            "ttft_off_ms": round(off, 1),
            "ttft_on_ms": round(on, 1),
            "speedup": round(off / on, 2) if on > 0 else 0.0,
        })
    return out


def report(profiles: list[tuple[str, list[dict[str, Any]]]], corrupt_pulls: int, requests_failed: int) -> dict[str, Any]:
    """`demo-report.json`'s content, in the shape the issue gives."""
    return {
        "profiles": [{"profile": name, "rows": table} for name, table in profiles],
        "corrupt_pulls": corrupt_pulls,
        "requests_failed": requests_failed,
    }


def write_json(data: dict[str, Any], path: Path) -> None:
    """Write the report."""
    path.write_text(json.dumps(data, indent=2) + "\n")


def _published(profile: str) -> dict[int, tuple[float, float, float]]:
    """AWS's (off, on, speedup) at its two published context lengths."""
    pub = sim_profile(profile).published
    return {n: (off, on, off / on) for n, off, on in zip(pub.contexts, pub.ttft_off_ms, pub.ttft_on_ms)}


def table(profile: str, data: list[dict[str, Any]], plans: dict[int, str] | None = None) -> Table:
    """The measured table with AWS's figures beside it (and how each measured turn was planned)."""
    p = sim_profile(profile)
    t = Table(title=f"{p.served_model_name} ({profile}): time to first token, Boomerang off vs on",
              title_justify="left", header_style="bold")
    for col in ("context", "TTFT off", "TTFT on", "speedup"):
        t.add_column(col, justify="right")
    for col in ("AWS off", "AWS on", "AWS speedup"):
        t.add_column(col, justify="right", style="dim")
    if plans is not None:
        t.add_column("pulled", justify="right")
    published = _published(profile)
    for row in data:
        aws = published.get(row["context_tokens"])
        t.add_row(
            f"{row['context_tokens']:,}",
            f"{row['ttft_off_ms']:,.0f} ms",
            f"{row['ttft_on_ms']:,.0f} ms",
            f"[bold]{row['speedup']:.2f}×[/bold]",
            *((f"{aws[0]:,.0f} ms", f"{aws[1]:,.0f} ms", f"{aws[2]:.2f}×") if aws else ("—", "—", "—")),
            *([plans.get(row["context_tokens"], "—")] if plans is not None else []),
        )
    t.caption = f"AWS reports a best speedup of {p.published.speedup}× at the longest context."
    return t


def chart(profiles: list[tuple[str, list[dict[str, Any]]]], path: Path) -> None:
    """TTFT against context length, off and on, with AWS's published points, one panel per profile."""
    # deferred: matplotlib (heavy, and only for the chart) loads only when a chart is drawn
    import matplotlib

    matplotlib.use("Agg")
    # deferred: pyplot after the backend is chosen
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(profiles), figsize=(6.2 * len(profiles), 4.6), squeeze=False)
    for ax, (name, data) in zip(axes[0], profiles):
        p = sim_profile(name)
        xs = [r["context_tokens"] / 1000 for r in data]
        ax.plot(xs, [r["ttft_off_ms"] for r in data], "o-", color="#c0392b", label="Boomerang off (recompute)")
        ax.plot(xs, [r["ttft_on_ms"] for r in data], "o-", color="#1f77b4", label="Boomerang on (pull)")
        pub = p.published
        px = [n / 1000 for n in pub.contexts]
        ax.plot(px, pub.ttft_off_ms, "s--", color="#c0392b", mfc="none", ms=9, alpha=0.6, label="AWS off (published)")
        ax.plot(px, pub.ttft_on_ms, "s--", color="#1f77b4", mfc="none", ms=9, alpha=0.6, label="AWS on (published)")
        if data:
            last = data[-1]
            ax.annotate(f"{last['speedup']:.2f}× at {last['context_tokens'] // 1000}k", (xs[-1], last["ttft_on_ms"]),
                        textcoords="offset points", xytext=(-10, 12), ha="right", fontsize=11, fontweight="bold",
                        color="#1f77b4")
        ax.set_title(f"{p.served_model_name}")
        ax.set_xlabel("context length (thousand tokens)")
        ax.set_ylabel("time to first token (ms)")
        ax.set_ylim(bottom=0)
        ax.set_xlim(left=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle("Boomerang: KV-cache reuse in P/D disaggregated serving (simulated engines)", fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
