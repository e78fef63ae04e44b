"""`boomerang up`: every service (and simulated engines) in the foreground until Ctrl-C."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from boomerang.config.settings import normalize_database_url

from boomerang_tools.sim.costmodel import profile
from boomerang_tools.stack.children import ChildFailed
from boomerang_tools.stack.postgres import PostgresError
from boomerang_tools.stack.stack import Stack, StackConfig, sims_for


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `up` subcommand."""
    parser = subparsers.add_parser(
        "up",
        help="run registry, reaper, router and gateway (and simulated engines) until Ctrl-C",
        description="Run the whole system locally in the foreground. Without a database URL it starts a "
        "private PostgreSQL cluster in --data-dir (kept between runs).",
    )
    parser.add_argument("--database-url", help="PostgreSQL URL (BOOMERANG_DATABASE_URL); default: embedded cluster")
    parser.add_argument("--gateway-port", type=int, default=8000, help="gateway HTTP port (default 8000; 0: a free one)")
    parser.add_argument("--sim", metavar="PxD", help="simulated engines: P prefill on 8100…, D decode on 8200… (e.g. 1x1)")
    parser.add_argument("--profile", default="qwen3-32b", help="simulated engines' cost profile (default qwen3-32b)")
    parser.add_argument("--ttl", type=float, default=480.0, help="simulated decode_kv_blocks_ttl, seconds (default 480)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="simulated latencies × this (default 1)")
    parser.add_argument("--strip-reasoning", action="store_true", help="simulate a Qwen3 thinking model's template")
    parser.add_argument("--hook", action="store_true",
                        help="the simulated engines run Boomerang's vLLM hook (sim --hook) and the gateway only routes "
                        "(--engine-hook)")
    parser.add_argument("--prefill", action="append", default=[], metavar="URL", help="an external prefill engine (repeatable)")
    parser.add_argument("--decode", action="append", default=[], metavar="URL", help="an external decode engine (repeatable)")
    anon = parser.add_mutually_exclusive_group()
    anon.add_argument("--allow-anonymous", dest="allow_anonymous", action="store_true", default=True,
                      help="serve requests without an API key as tenant 'anonymous' (the default here)")
    anon.add_argument("--require-keys", dest="allow_anonymous", action="store_false",
                      help="require API keys (make them with `boomerang tenants create NAME`)")
    parser.add_argument("--data-dir", default=".boomerang", help="embedded database and logs (default .boomerang)")
    parser.add_argument("--free-ports", action="store_true",
                        help="bind every service and engine to a free port instead of the defaults")
    parser.add_argument("--log-level", default="INFO", help="services' logging level (default INFO)")
    parser.set_defaults(handler=_run)


def _config(args: argparse.Namespace) -> StackConfig:
    database_url = args.database_url or os.environ.get("BOOMERANG_DATABASE_URL", "")
    if database_url:
        try:
            normalize_database_url(database_url)
        except ValueError as exc:
            raise SystemExit(f"boomerang up: --database-url {exc}") from None
    if bool(args.prefill) != bool(args.decode):
        raise SystemExit("boomerang up: give both --prefill and --decode, or neither")
    if not args.sim and not args.prefill:
        raise SystemExit("boomerang up: no engines: give --sim PxD (e.g. --sim 1x1) or --prefill URL --decode URL")
    try:
        sims = sims_for(args.sim, args.profile, 0 if args.free_ports else 8100, 0 if args.free_ports else 8200) if args.sim else []
    except ValueError as exc:
        raise SystemExit(f"boomerang up: {exc}") from None
    return StackConfig(
        data_dir=Path(args.data_dir),
        database_url=database_url,
        gateway_port=0 if args.free_ports and args.gateway_port == 8000 else args.gateway_port,
        grpc_ports=(0, 0, 0) if args.free_ports else (50051, 50052, 50053),
        sims=sims,
        prefill_urls=args.prefill,
        decode_urls=args.decode,
        ttl_seconds=args.ttl,
        time_scale=args.time_scale,
        allow_anonymous=args.allow_anonymous,
        strip_reasoning=args.strip_reasoning,
        hook=args.hook,
        log_level=args.log_level,
    )


def _run(args: argparse.Namespace) -> int:
    try:
        served = profile(args.profile).served_model_name
    except ValueError as exc:
        raise SystemExit(f"boomerang up: --profile: {exc}") from None
    stack = Stack(_config(args))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print("boomerang up: starting…", flush=True)
    try:
        stack.start()
    except (ChildFailed, PostgresError) as exc:
        print(f"boomerang up: {exc}", file=sys.stderr)
        return 1
    width = max(len(e.name) for e in stack.endpoints)
    print("\nBoomerang is up (Ctrl-C to stop):")
    for e in stack.endpoints:
        print(f"  {e.name:<{width}}  {e.address:<28} {e.note}")
    print(f"  {'logs':<{width}}  {stack.log_dir}/")
    if args.sim:
        print(
            f"\nTry:\n  curl -s {stack.gateway_url}/v1/chat/completions -H 'content-type: application/json' \\\n"
            f"    -d '{{\"model\": \"{served}\", \"conversation_id\": \"demo-1\", "
            f"\"messages\": [{{\"role\": \"user\", \"content\": \"hello\"}}]}}' -i"
        )
    print(f"BOOMERANG_READY up {stack.gateway_url.removeprefix('http://')}", flush=True)
    code = 0
    try:
        while not stop.wait(0.5):
            dead = stack.dead_children()
            if dead:
                for child in dead:
                    print(f"boomerang up: {child.name} exited unexpectedly\n{child.tail()}", file=sys.stderr)
                code = 1
                break
    finally:
        print("\nboomerang up: stopping…", flush=True)
        stack.stop()
        print("boomerang up: stopped", flush=True)
    return code
