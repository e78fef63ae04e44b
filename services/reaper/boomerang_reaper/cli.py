"""`boomerang reaper` (the TTL-reaper service) and `boomerang advise-ttl` (TTL advice)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os

from boomerang.clients.reaper import ReaperClient
from boomerang.v1 import reaper_service_pb2 as pb
from boomerang_server.config import service_command

from boomerang_reaper.advice_report import render_table, to_json
from boomerang_reaper.convert import advice_from_proto
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
