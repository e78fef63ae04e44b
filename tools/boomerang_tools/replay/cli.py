"""`boomerang replay FILE --url URL [--mode on|off|both]`: replay conversations, reuse off
and/or on, and summarize TTFT by context-length bucket.

AWS's advice to teams weighing KV-cache reuse: replay a recorded session with the feature
off and on and compare time to first token at your real context lengths. Off sends no
conversation id and `X-Boomerang-Reuse: off` (plain prefill→decode on a Boomerang gateway;
no id means no reuse on any proxy); on sends the conversation id (`X-Conversation-Id`, and
the body field with `--send-conversation-id` as vLLM's benchmark does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from boomerang_tools.demo.client import REUSE_HEADER, TurnResult, stream_chat
from boomerang_tools.replay.loader import Conversation, ReplayFormatError, load

TIMEOUT = 300.0  # seconds a turn may take


@dataclass
class Sample:
    """One replayed turn."""

    mode: str
    conversation_id: str
    turn: int
    result: TurnResult


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


def bucket_of(tokens: int, edges: tuple[int, ...]) -> str:
    """The bucket label of a prompt length, e.g. `2k–4k`."""
    low = 0
    for edge in edges:
        if tokens < edge:
            return f"{_k(low)}–{_k(edge)}"
        low = edge
    return f"≥{_k(low)}"


def _k(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summarize(replayed: list[Sample], edges: tuple[int, ...]) -> list[dict[str, Any]]:
    """Per bucket: turns and TTFT p50/p90 per mode, and the speedup of the medians."""
    groups: dict[str, dict[str, list[Sample]]] = {}
    order: dict[str, int] = {}
    for s in replayed:
        if not s.result.ok or not s.result.prompt_tokens:
            continue
        label = bucket_of(s.result.prompt_tokens, edges)
        order.setdefault(label, s.result.prompt_tokens)
        order[label] = min(order[label], s.result.prompt_tokens)
        groups.setdefault(label, {}).setdefault(s.mode, []).append(s)
    rows = []
    for label in sorted(groups, key=lambda b: order[b]):
        row: dict[str, Any] = {"bucket": label}
        for mode, samples in sorted(groups[label].items()):
            ttfts = [s.result.ttft_ms for s in samples]
            row[mode] = {
                "turns": len(samples),
                "ttft_p50_ms": round(statistics.median(ttfts), 1),
                "ttft_p90_ms": round(_percentile(ttfts, 0.9), 1),
                "mean_prompt_tokens": round(statistics.fmean(s.result.prompt_tokens for s in samples)),
                "plans": dict(Counter(s.result.plan or "—" for s in samples)),
            }
        if "off" in row and "on" in row and row["on"]["ttft_p50_ms"] > 0:
            row["speedup"] = round(row["off"]["ttft_p50_ms"] / row["on"]["ttft_p50_ms"], 2)
        rows.append(row)
    return rows


async def _model(http: httpx.AsyncClient, url: str, headers: dict[str, str]) -> str:
    resp = await http.get(url.rstrip("/") + "/v1/models", headers=headers, timeout=30)
    resp.raise_for_status()
    data = resp.json().get("data") or []
    if not data:
        raise RuntimeError(f"{url}/v1/models lists no model; give --model")
    return str(data[0]["id"])


async def _replay_one(
    http: httpx.AsyncClient, conv: Conversation, mode: str, run_id: str, opts: argparse.Namespace,
    model: str, headers: dict[str, str], out: list[Sample], on_turn: Callable[[], None],
) -> None:
    cid = f"{conv.conversation_id}-{run_id}"
    history = list(conv.system)
    for i, turn in enumerate(conv.turns):
        if turn.body is not None:
            body = dict(turn.body)
        else:
            assert turn.user is not None
            history.append(turn.user)
            body = {"messages": list(history)}
        body["model"] = opts.model or body.get("model") or model
        if opts.max_tokens is not None:
            body["max_tokens"] = opts.max_tokens
            body.pop("max_completion_tokens", None)
        hdrs = dict(headers)
        if mode == "off":
            hdrs[REUSE_HEADER] = "off"
        else:
            hdrs["X-Conversation-Id"] = cid
            if opts.send_conversation_id:
                body["conversation_id"] = cid
        result = await stream_chat(http, opts.url, body, hdrs, timeout=TIMEOUT)
        out.append(Sample(mode, conv.conversation_id, i, result))
        on_turn()
        if not result.ok:
            for _ in conv.turns[i + 1:]:
                on_turn()
            return
        if turn.user is not None:
            history.append({"role": "assistant", "content": result.text})


async def check_reachable(url: str) -> None:
    """Connect to the endpoint once before replaying anything.

    One that cannot be reached raises httpx's ConnectError (or ConnectTimeout) here, which
    `boomerang` reports as one line, rather than failing every turn after a table of nothing.
    Any answer, even an error status or a slow one, means it is there: the turns say the rest."""
    async with httpx.AsyncClient(timeout=10.0) as http:
        try:
            await http.get(url.rstrip("/") + "/v1/models")
        except (httpx.ConnectError, httpx.ConnectTimeout):
            raise
        except httpx.HTTPError:
            return


async def replay(
    conversations: list[Conversation], args: argparse.Namespace, modes: tuple[str, ...],
    headers: dict[str, str], on_turn: Callable[[], None],
) -> list[Sample]:
    """Replay every conversation in each mode (all of one mode, then the next)."""
    out: list[Sample] = []
    limits = httpx.Limits(max_connections=max(4, args.concurrency * 2))
    async with httpx.AsyncClient(limits=limits, timeout=TIMEOUT) as http:
        model = args.model or (await _model(http, args.url, headers) if any(
            t.body is None or not t.body.get("model") for c in conversations for t in c.turns) else "")
        for mode in modes:
            run_id = uuid.uuid4().hex[:8]
            gate = asyncio.Semaphore(args.concurrency)

            async def one(
                conv: Conversation, mode: str = mode, run_id: str = run_id, gate: asyncio.Semaphore = gate
            ) -> None:
                async with gate:
                    await _replay_one(http, conv, mode, run_id, args, model, headers, out, on_turn)

            await asyncio.gather(*(one(c) for c in conversations))
    return out


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
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY", "")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    turns = sum(len(c.turns) for c in conversations) * len(modes)
    with Progress(TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TextColumn("turns"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("", total=turns)
        try:
            samples = asyncio.run(replay(conversations, args, modes, headers,
                                         lambda: progress.advance(task)))
        except Exception as exc:  # noqa: BLE001 - e.g. the endpoint is unreachable
            raise SystemExit(f"boomerang replay: {exc!r}") from None
    rows = summarize(samples, edges)
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
                   "error": s.result.error} for s in samples]
        args.json.write_text(json.dumps({"buckets": rows, "turns": detail}, indent=2) + "\n")
        console.print(f"wrote {args.json}")
    failed = [s for s in samples if not s.result.ok]
    if failed:
        console.print(f"[bold red]{len(failed)} failed turn(s)[/bold red]: "
                      f"{failed[0].result.error[:200]}")
        return 1
    return 0
