"""TTL advice for people (a table to act on) and for programs (JSON)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from boomerang_reaper.advice import TtlAdvice


def _bytes(n: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 600 else f"{s / 60:.1f} min"


def to_json(advice: Sequence[TtlAdvice], target: float, safety: float, history: dict[str, Any]) -> dict[str, Any]:
    """The advice as a JSON-ready dictionary."""
    return {
        "target_reuse": target,
        "safety_seconds": safety,
        "history": history,
        "advice": [
            {
                "tenant": a.tenant,
                "model": a.model,
                "turns": a.turns,
                "next_turns": a.next_turns,
                "exact_pauses": a.exact_pauses,
                "pause_seconds": {f"p{q:g}" if q < 100 else "max": s for q, s in a.pause_percentiles},
                "recommended_ttl_seconds": a.recommended_ttl_seconds,
                "current_ttl_seconds": a.current_ttl_seconds,
                "bytes_known_share": a.bytes_known_share,
                "candidates": [
                    {
                        "ttl_seconds": c.ttl_seconds,
                        "reuse_share": c.reuse_share,
                        "block_seconds": c.block_seconds,
                        "byte_seconds": c.byte_seconds,
                        "mean_resident_blocks": c.mean_resident_blocks,
                        "mean_resident_bytes": c.mean_resident_bytes,
                        "recommended": c.recommended,
                        "current": c.current,
                    }
                    for c in a.candidates
                ],
            }
            for a in advice
        ],
    }


def _verdict(a: TtlAdvice, target: float) -> str:
    if not a.recommended_ttl_seconds:
        return "no turn was followed by a next turn yet: nothing to recommend"
    rec = next(c for c in a.candidates if c.recommended)
    line = (
        f"recommendation: decoder_kv_blocks_ttl = {a.recommended_ttl_seconds} s "
        f"({rec.reuse_share:.1%} of next turns would find their blocks alive; target {target:.0%})"
    )
    cur = next((c for c in a.candidates if c.current), None)
    if cur is not None and cur.block_seconds > 0 and not cur.recommended:
        change = rec.block_seconds / cur.block_seconds - 1
        line += f"; decode KV memory {change:+.0%} vs the current {cur.ttl_seconds} s"
    return line


def render_table(advice: Sequence[TtlAdvice], target: float, safety: float) -> str:
    """The advice as text: per tenant and model, pauses, a candidate table, a verdict."""
    if not advice:
        return "no finished turns in the history (nothing registered, or filtered out)\n"
    out: list[str] = []
    for a in advice:
        head = f"tenant {a.tenant} · model {a.model} · {a.turns} turns, {a.next_turns} with a next turn"
        head += f" ({a.exact_pauses} exact)"
        if a.current_ttl_seconds:
            head += f" · current TTL {a.current_ttl_seconds} s"
        out.append(head)
        if a.pause_percentiles:
            cells = "  ".join(f"{'max' if q >= 100 else f'p{q:g}'} {_seconds(s)}" for q, s in a.pause_percentiles)
            out.append(f"  pause before the next turn: {cells}")
        show_bytes = a.bytes_known_share > 0
        cols = f"  {'':2}{'TTL':>8}  {'reuse':>7}  {'block-s':>12}  {'mean blocks':>12}"
        out.append(cols + (f"  {'mean memory':>12}" if show_bytes else ""))
        for c in a.candidates:
            mark = "*" if c.recommended else ("c" if c.current else " ")
            row = (
                f"  {mark:2}{c.ttl_seconds:>6} s  {c.reuse_share:>7.1%}  {c.block_seconds:>12.0f}"
                f"  {c.mean_resident_blocks:>12.1f}"
            )
            if show_bytes:
                row += f"  {_bytes(c.mean_resident_bytes):>12}"
            out.append(row)
        legend = f"  (* recommended, c current; a next turn needs pause < TTL − {safety:g} s"
        if show_bytes and a.bytes_known_share < 1:
            legend += f"; memory covers the {a.bytes_known_share:.0%} of blocks whose engine reports bytes"
        out.append(legend + ")")
        out.append("  " + _verdict(a, target))
        out.append("")
    return "\n".join(out)
