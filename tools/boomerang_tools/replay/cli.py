"""`boomerang replay FILE --url URL [--mode on|off|both]`."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
from pathlib import Path
from urllib.parse import urlsplit

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from boomerang_tools.replay.loader import ReplayFormatError, load
from boomerang_tools.replay.runner import ReplayOptions, check_reachable, replay, summarize


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `replay` subcommand."""
    parser = subparsers.add_parser(
        "replay",
        help="replay recorded conversations against an OpenAI-compatible endpoint; TTFT by context length",
        description="Replay recorded conversations (JSONL of chat requests with conversation ids, or ShareGPT "
        "JSON) with KV reuse off and/or on, timing the first streamed token of every turn.",
    )
    parser.add_argument("file", type=Path, help="JSONL of OpenAI chat requests, or ShareGPT-style JSON")
    parser.add_argument("--url", required=True, help="the endpoint's base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--mode", choices=["on", "off", "both"], default="both", help="reuse off, on, or both (default)")
    parser.add_argument("--model", help="model name for every request (default: as recorded, else the endpoint's first)")
    parser.add_argument("--api-key", help="bearer key (default: OPENAI_API_KEY if set)")
    parser.add_argument("--concurrency", type=int, default=1, help="conversations in flight at once (default 1)")
    parser.add_argument("--max-tokens", type=int, help="cap every reply at this many tokens")
    parser.add_argument("--limit", type=int, help="replay only the first N conversations")
    parser.add_argument("--buckets", default="2000,4000,8000,16000,32000",
                        help="context-length bucket edges in tokens (default 2000,4000,8000,16000,32000)")
    parser.add_argument("--send-conversation-id", action="store_true",
                        help="also send conversation_id in the body (vLLM's proxy and benchmark convention)")
    parser.add_argument("--json", type=Path, help="also write the summary and every turn's TTFT here")
    parser.set_defaults(handler=_run)


def _edges(text: str) -> tuple[int, ...]:
    try:
        edges = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise SystemExit(f"boomerang replay: --buckets must be integers, got {text!r}") from None
    if not edges or edges[0] <= 0:
        raise SystemExit("boomerang replay: --buckets must be positive token counts")
    return edges


def _run(args: argparse.Namespace) -> int:
    console = Console()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    edges = _edges(args.buckets)
    if args.concurrency < 1:
        raise SystemExit("boomerang replay: --concurrency must be at least 1")
    try:
        conversations = load(args.file)
    except (OSError, ReplayFormatError, ValueError) as exc:
        raise SystemExit(f"boomerang replay: {args.file}: {exc}") from None
    if args.limit:
        conversations = conversations[: args.limit]
    if not conversations:
        raise SystemExit(f"boomerang replay: {args.file}: no conversations")
    parts = urlsplit(args.url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SystemExit(f"boomerang replay: --url {args.url!r}: give the endpoint's base URL, e.g. http://127.0.0.1:8000")
    # Before any output: an endpoint that cannot be reached is one line from `boomerang`.
    asyncio.run(check_reachable(args.url))
    modes = ("off", "on") if args.mode == "both" else (args.mode,)
    opts = ReplayOptions(url=args.url, modes=modes, model=args.model or "",
                         api_key=args.api_key or os.environ.get("OPENAI_API_KEY", ""),
                         concurrency=args.concurrency, max_tokens=args.max_tokens,
                         send_conversation_id=args.send_conversation_id)
    turns = sum(len(c.turns) for c in conversations) * len(modes)
    with Progress(TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TextColumn("turns"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("", total=turns)
        try:
            result = asyncio.run(replay(conversations, opts, lambda: progress.advance(task)))
        except Exception as exc:  # noqa: BLE001 - e.g. the endpoint is unreachable
            raise SystemExit(f"boomerang replay: {exc!r}") from None
    rows = summarize(result, edges)
    table = Table(title=f"Time to first token by context length ({len(conversations)} conversations, {args.url})",
                  title_justify="left", header_style="bold")
    table.add_column("context", justify="right")
    for mode in modes:
        table.add_column(f"{mode}: turns", justify="right")
        table.add_column(f"{mode}: p50", justify="right")
        table.add_column(f"{mode}: p90", justify="right")
    if len(modes) == 2:
        table.add_column("speedup (p50)", justify="right")
    for row in rows:
        cells = [row["bucket"]]
        for mode in modes:
            m = row.get(mode)
            cells += [str(m["turns"]), f"{m['ttft_p50_ms']:,.0f} ms", f"{m['ttft_p90_ms']:,.0f} ms"] if m else ["0", "—", "—"]
        if len(modes) == 2:
            cells.append(f"{row['speedup']:.2f}×" if "speedup" in row else "—")
        table.add_row(*cells)
    console.print(table)
    if args.json:
        detail = [{"mode": s.mode, "conversation_id": s.conversation_id, "turn": s.turn, "ok": s.result.ok,
                   "prompt_tokens": s.result.prompt_tokens, "ttft_ms": round(s.result.ttft_ms, 1),
                   "plan": s.result.plan, "reason": s.result.reason, "reused_tokens": s.result.reused_tokens,
                   "error": s.result.error} for s in result.samples]
        args.json.write_text(json.dumps({"buckets": rows, "turns": detail}, indent=2) + "\n")
        console.print(f"wrote {args.json}")
    if result.failed:
        console.print(f"[bold red]{len(result.failed)} failed turn(s)[/bold red]: {result.failed[0].result.error[:200]}")
        return 1
    return 0
