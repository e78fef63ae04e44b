"""`boomerang reaper` (the TTL-reaper service) and `boomerang advise-ttl` (TTL advice, printed for
people as a table to act on, or for programs as JSON)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from boomerang.clients.reaper import ReaperClient
from boomerang.v1 import reaper_service_pb2 as pb
from boomerang_server.config import service_command

from boomerang_reaper.advice import TtlAdvice, advice_from_proto
from boomerang_reaper.server import run
from boomerang_reaper.settings import ReaperSettings

REAPER_ENV = "BOOMERANG_REAPER_ADDRESS"
DEFAULT_REAPER = "127.0.0.1:50053"


_register_reaper = service_command(
    "reaper", "run a TTL-reaper replica (expiry, engine liveness, retention)", ReaperSettings, run)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `reaper` (its flags are ReaperSettings' fields) and `advise-ttl` subcommands."""
    _register_reaper(subparsers)

    advise = subparsers.add_parser(
        "advise-ttl",
        help="advise on decoder_kv_blocks_ttl from the audit history (reuse vs. decode memory)",
        description="Per tenant and model: pauses between turns, the reuse and decode-node memory "
        "of candidate TTLs, and the shortest TTL that reaches the target reuse rate.",
    )
    advise.add_argument("--tenant", default="", help="only this tenant")
    advise.add_argument("--model", default="", help="only this served model")
    advise.add_argument("--target", type=float, default=0.0, help="share of next turns that should find their blocks (default 0.95)")
    advise.add_argument("--history-hours", type=float, default=0.0, help="hours of history to read (default 168)")
    advise.add_argument("--candidates", default="", help="comma-separated TTLs in seconds to evaluate")
    advise.add_argument(
        "--safety-seconds", type=float, help="registry TTL margin + a claim's minimum remaining lifetime (default 15)"
    )
    advise.add_argument("--json", action="store_true", help="print JSON instead of a table")
    advise.add_argument("--reaper", metavar="ADDR", default=os.environ.get(REAPER_ENV, DEFAULT_REAPER),
                        help=f"the reaper service to ask, HOST:PORT (default: ${REAPER_ENV}, else {DEFAULT_REAPER})")
    advise.set_defaults(handler=_run_advise)


def _candidates(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise SystemExit("boomerang advise-ttl: --candidates must be whole seconds, e.g. 60,120,300") from None


def _run_advise(args: argparse.Namespace) -> int:
    # A failed call to the reaper (BoomerangClientError) is left to `boomerang`, which words it as
    # every command's: one line naming the reaper at --reaper and the fix (boomerang_cli.failures);
    # so is the reaper's INVALID_ARGUMENT naming a bad field.
    target, safety, advice, history = asyncio.run(_advice(args))
    if args.json:
        print(json.dumps(to_json(advice, target, safety, history), indent=2))
    else:
        print(f"TTL advice from {history['start']} to {history['end']}")
        print(render_table(advice, target, safety))
    return 0


async def _advice(args: argparse.Namespace) -> tuple[float, float, list, dict]:  # type: ignore[type-arg]
    req = pb.AdviseTTLRequest(
        tenant=args.tenant, model=args.model, target_reuse=args.target,
        history_hours=args.history_hours, candidate_ttl_seconds=_candidates(args.candidates),
    )
    if args.safety_seconds is not None:
        req.safety_seconds = args.safety_seconds
    async with ReaperClient(args.reaper) as client:
        resp = await client.advise_ttl(req)
    history = {
        "start": resp.history_start_time.ToDatetime().isoformat() + "Z",
        "end": resp.history_end_time.ToDatetime().isoformat() + "Z",
    }
    return resp.target_reuse, resp.safety_seconds, [advice_from_proto(a) for a in resp.advice], history


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
                "candidates": [asdict(c) for c in a.candidates],
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
