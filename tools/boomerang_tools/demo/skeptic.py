"""The skeptic's question: why not prefix caching on the prefill engine, with sticky routing?

The `prefix-cache` mode (`modes.PREFIX_CACHE`) runs no Boomerang: the prefill engine keeps a
finite prefix cache (LRU over blocks, as vLLM's) and the gateway sends each conversation to
the same prefill engine. It is measured with 1, 8 and 32 conversations sharing that engine,
their turns in rotation. This module puts it beside Boomerang off (recompute) and Boomerang
on at each number of conversations and context: the table, the chart panel, the report's
`concurrency` rows and the verdict printed at the end.

Why the answer depends on the number of conversations: P's cache holds a conversation's
previous turn only while fewer than its capacity's worth of other tokens came after it. One
or a few conversations fit: every turn hits, nothing moves between engines, and that beats
Boomerang, which pulls the previous turn back from the decode engine (`τ0 + τ1·r`). Many long
conversations in rotation evict each other before their next turn (LRU with N × context
beyond capacity misses every time), so P recomputes as with no cache at all — while the
decode engine still holds each conversation's last turn, which Boomerang pulls.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from boomerang_tools.demo import report
from boomerang_tools.demo.modes import Mode
from boomerang_tools.demo.runner import RunResult
from boomerang_tools.sim.costmodel import profile as sim_profile

# (profile, conversations, contexts): one measured level above 1 of the prefix-cache mode.
Rotation = tuple[str, int, tuple[int, ...]]


def levels(profile: str, level_one: tuple[int, ...], rotations: list[Rotation]) -> list[tuple[int, tuple[int, ...]]]:
    """(conversations, contexts) measured for `profile`: one conversation at `level_one`, then
    each rotation of it."""
    return [(1, level_one), *((n, pts) for p, n, pts in rotations if p == profile)]


def rows(result: RunResult, profile: str, mode: Mode, boomerang: Mode | None, conversations: int,
         points: tuple[int, ...]) -> list[dict[str, Any]]:
    """One row per context: off, this mode, and Boomerang on (`boomerang`'s deployment), in ms.

    Off and Boomerang are measured one conversation at a time: neither depends on how many
    conversations share the prefill engine here (no prefix cache on it; the decode engine's
    pool holds every conversation's last turn, and the simulator models no batching)."""
    out = []
    for point in points:
        off = result.ttft(profile, "off", point)
        mine = result.ttft(profile, "on", point, mode.name, conversations)
        cached = result.cached(profile, point, mode.name, conversations)
        on = result.ttft(profile, "on", point, boomerang.name) if boomerang is not None else None
        if off is None or mine is None or cached is None:
            continue
        out.append({
            "context_tokens": point,
            "ttft_off_ms": round(off, 1),
            "ttft_prefix_cache_ms": round(mine, 1),
            "ttft_boomerang_ms": round(on, 1) if on is not None else None,
            "cached_tokens": int(cached),
            "cached_share": round(cached / point, 2),
            "faster": "boomerang" if on is not None and on < mine else "prefix-cache",
        })
    return out


def report_entry(result: RunResult, profile: str, mode: Mode, boomerang: Mode | None,
                 measured: list[tuple[int, tuple[int, ...]]]) -> list[dict[str, Any]]:
    """The report's `concurrency` field for the prefix-cache entry of `profile`."""
    return [{"conversations": n, "rows": rows(result, profile, mode, boomerang, n, pts)} for n, pts in measured]


def table(profile: str, entry: list[dict[str, Any]], boomerang: Mode | None, capacity_tokens: int) -> Table:
    """Off, prefix cache + sticky routing, and Boomerang, by conversations sharing one prefill engine."""
    p = sim_profile(profile)
    t = Table(title=f"{p.served_model_name}: prefix caching on the prefill engine with sticky routing "
              f"(room for {capacity_tokens:,} tokens) vs Boomerang", title_justify="left", header_style="bold")
    for col in ("conversations", "context", "off (recompute)", "prefix cache", "P cache hits",
                f"Boomerang ({boomerang.label})" if boomerang else "Boomerang", "faster"):
        t.add_column(col, justify="right")
    for level in entry:
        for i, row in enumerate(level["rows"]):
            on = row["ttft_boomerang_ms"]
            t.add_row(
                f"{level['conversations']}" if i == 0 else "",
                f"{row['context_tokens']:,}",
                f"{row['ttft_off_ms']:,.0f} ms",
                f"{row['ttft_prefix_cache_ms']:,.0f} ms",
                f"{row['cached_tokens']:,} ({row['cached_share']:.0%})",
                f"{on:,.0f} ms" if on is not None else "—",
                "[bold green]Boomerang[/bold green]" if row["faster"] == "boomerang" else "prefix cache",
            )
    t.caption = ("Conversations share one prefill engine, their turns in rotation; off and Boomerang do not depend "
                 "on how many (the decode engine keeps every conversation's last turn).")
    return t


def verdict(profile: str, entry: list[dict[str, Any]]) -> list[str]:
    """Where Boomerang wins, where it does not, and why, from the measured rows."""
    lines = []
    one = next((lv for lv in entry if lv["conversations"] == 1), None)
    many = max(entry, key=lambda lv: lv["conversations"]) if entry else None
    if one and one["rows"] and one["rows"][-1]["ttft_boomerang_ms"] is not None:
        r = one["rows"][-1]
        lines.append(
            f"{profile}, 1 conversation at {r['context_tokens']:,} tokens: prefix cache {r['ttft_prefix_cache_ms']:,.0f} "
            f"ms, Boomerang {r['ttft_boomerang_ms']:,.0f} ms, off {r['ttft_off_ms']:,.0f} ms. "
            + ("Boomerang does not win here: " if r["faster"] == "prefix-cache" else "Boomerang is faster even here: ")
            + f"P's own cache still holds the conversation ({r['cached_tokens']:,} of its {r['context_tokens']:,} "
            "tokens hit), so nothing moves between engines, while Boomerang pulls the previous turn back from the "
            "decode engine.")
    if many and many is not one and many["rows"]:
        n, r = many["conversations"], many["rows"][-1]
        on, near_off = r["ttft_boomerang_ms"], r["ttft_prefix_cache_ms"] > 0.8 * r["ttft_off_ms"]
        lines.append(
            f"{profile}, {n} conversations at {r['context_tokens']:,} tokens: prefix cache "
            f"{r['ttft_prefix_cache_ms']:,.0f} ms ({r['cached_tokens']:,} of {r['context_tokens']:,} tokens hit"
            + (f"; about what recomputing costs, {r['ttft_off_ms']:,.0f} ms)" if near_off
               else f"; off {r['ttft_off_ms']:,.0f} ms)")
            + (f", Boomerang {on:,.0f} ms" if on is not None else "")
            + (". Boomerang wins: " if r["faster"] == "boomerang" else ". Boomerang did not win this time, though: ")
            + f"{n} conversations of {r['context_tokens']:,} tokens do not fit in P's cache, so each one's blocks "
            "are evicted (least recently used) before its next turn, while the decode engine still holds every "
            "conversation's last turn.")
    return lines


def panel(ax: Any, profile: str, entry: list[dict[str, Any]], boomerang: Mode | None,
          capacity_tokens: int) -> list[tuple[float, float, str, str]]:
    """The chart's lower panel: TTFT against context, off and Boomerang, and the prefix cache
    at each number of conversations; returns its labels, for the chart to place once laid out."""
    p = sim_profile(profile)
    one: list[dict[str, Any]] = next((lv["rows"] for lv in entry if lv["conversations"] == 1), [])
    xs = [r["context_tokens"] / 1000 for r in one]
    ax.plot(xs, [r["ttft_off_ms"] for r in one], "o-", color="#c0392b", label="Boomerang off (recompute)")
    if any(r["ttft_boomerang_ms"] is not None for r in one):
        ax.plot(xs, [r["ttft_boomerang_ms"] for r in one], "o-", color="#1f77b4",
                label=f"Boomerang on: {boomerang.label if boomerang else ''}")
    labels: list[tuple[float, float, str, str]] = []
    shades = ("#7dcea0", "#27ae60", "#145a32", "#0b3d20")
    for i, level in enumerate(entry):
        data = level["rows"]
        if not data:
            continue
        color, n = shades[i % len(shades)], level["conversations"]
        ax.plot([r["context_tokens"] / 1000 for r in data], [r["ttft_prefix_cache_ms"] for r in data], "s--",
                color=color, ms=7, label=f"prefix cache + sticky, {n} conversation" + ("s" if n > 1 else ""))
        last = data[-1]
        labels.append((last["context_tokens"] / 1000, last["ttft_prefix_cache_ms"],
                       f"{n}× {last['cached_share']:.0%} hit", color))
    ax.set_title(f"{p.served_model_name}: the skeptic's alternative (P's cache: {capacity_tokens // 1000}k tokens)",
                 fontsize=10)
    report.frame(ax, max(xs, default=1.0), 7)
    return labels
