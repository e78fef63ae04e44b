"""`boomerang router`: the routing service."""

from __future__ import annotations

import argparse

from boomerang.config.flags import add_common_flags, common_overrides, require_database, run_async
from boomerang.config.settings import load_settings

from boomerang_router.server import run
from boomerang_router.settings import RouterSettings


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `router` subcommand."""
    parser = subparsers.add_parser("router", help="run the router gRPC service (turn plans, engine choice)")
    add_common_flags(parser)
    parser.add_argument("--listen", help="gRPC HOST:PORT (BOOMERANG_LISTEN, default 127.0.0.1:50052)")
    parser.add_argument("--registry", help="block registry HOST:PORT (BOOMERANG_REGISTRY_ADDRESS, default 127.0.0.1:50051)")
    parser.add_argument("--prefill", action="append", metavar="[NAME=]URL",
                        help="a static prefill engine (repeatable); without any, engines come from the registry")
    parser.add_argument("--decode", action="append", metavar="[NAME=]URL",
                        help="a static decode engine (repeatable); without any, engines come from the registry")
    parser.add_argument("--claim-deadline-ms", type=float, help="wait this long for a claim before degrading (default 50; longer for "
                        "long prompts, BOOMERANG_CLAIM_WAIT_SHARE)")
    parser.add_argument("--min-remaining-seconds", type=float, help="a claimed lease must live this much longer (default 10)")
    parser.add_argument("--block-size", type=int, help="tokens per KV block when engines do not say (default 16)")
    parser.add_argument("--kv-recompute-threshold", type=int, help="fewest tokens worth a pull when P does not say (default 64)")
    parser.add_argument("--heartbeat-timeout-seconds", type=float, help="stale heartbeats leave the pool after this (default 30; 0 never)")
    parser.add_argument("--engine-refresh-seconds", type=float, help="seconds between engine refreshes (default 1)")
    parser.add_argument("--health-check-seconds", type=float, help="seconds between static engines' /health probes (default 2; 0 off)")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    settings = load_settings(
        RouterSettings,
        **common_overrides(args),
        listen=args.listen,
        registry_address=args.registry,
        prefill_engines=args.prefill,
        decode_engines=args.decode,
        claim_deadline_ms=args.claim_deadline_ms,
        min_remaining_seconds=args.min_remaining_seconds,
        block_size=args.block_size,
        kv_recompute_threshold=args.kv_recompute_threshold,
        heartbeat_timeout_seconds=args.heartbeat_timeout_seconds,
        engine_refresh_seconds=args.engine_refresh_seconds,
        health_check_seconds=args.health_check_seconds,
    )
    require_database(settings, "router")

    run_async(run(settings))
    return 0
