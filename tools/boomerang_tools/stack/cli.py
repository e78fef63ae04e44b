"""`boomerang up`: every service (and simulated engines) in the foreground until Ctrl-C."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from boomerang_cli.context import (
    CONTEXT_ENV,
    DEFAULT_PATH,
    FILE_NAME,
    SOURCES,
    StackContext,
    remove_context,
    write_context,
)
from boomerang_server.config import normalize_database_url

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
    parser.add_argument("--data-dir", default=".boomerang",
                        help="embedded database, logs and context.json, where `boomerang status` and `audit` run from "
                        "this folder find the stack (default .boomerang)")
    parser.add_argument("--ha", action="store_true",
                        help="a highly available Postgres for this run instead of the embedded one: three Patroni "
                        "nodes on etcd, reached through one multi-host URL (needs etcd and the system's PostgreSQL)")
    parser.add_argument("--ha-synchronous", action="store_true",
                        help="with --ha: Patroni's synchronous_mode (a commit waits for a standby; default asynchronous)")
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
    if args.ha and database_url:
        raise SystemExit("boomerang up: --ha runs its own Postgres; give it or a database URL, not both")
    if args.ha_synchronous and not args.ha:
        raise SystemExit("boomerang up: --ha-synchronous needs --ha")
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
        ha_nodes=3 if args.ha else 0,
        ha_synchronous=args.ha_synchronous,
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
    code = 0
    try:
        context = write_context(stack.config.data_dir, _context(stack))
        _banner(stack, context, served if args.sim else "")
        while not stop.wait(0.5):
            dead = stack.dead_children()
            if dead:
                for child in dead:
                    print(f"boomerang up: {child.name} exited unexpectedly\n{child.tail()}", file=sys.stderr)
                code = 1
                break
    finally:
        remove_context(stack.config.data_dir / FILE_NAME)  # first: nothing may find a stopping stack
        print("\nboomerang up: stopping…", flush=True)
        stack.stop()
        print("boomerang up: stopped", flush=True)
    return code


def _context(stack: Stack) -> StackContext:
    """Where everything listens, for `boomerang status` and `audit` run from this folder (context.py)."""
    return StackContext(
        registry=stack.registry_address,
        router=stack.router_address,
        reaper=stack.reaper_address,
        gateway=stack.gateway_url,
        tenant="anonymous" if stack.config.allow_anonymous else "",
        # A cluster of our own only (the embedded one, whose password already sits in this folder,
        # or this run's HA one); a configured one may be a shared server's, kept out of files.
        database_url=stack.database_url if stack.postgres is not None or stack.ha is not None else "",
    )


def _banner(stack: Stack, context: Path, served: str) -> None:
    """What runs where, and the commands to try, as they will work from this folder."""
    width = max(len(e.name) for e in stack.endpoints)
    print("\nBoomerang is up (Ctrl-C to stop):")
    for e in stack.endpoints:
        print(f"  {e.name:<{width}}  {e.address:<28} {e.note}")
    print(f"  {'logs':<{width}}  {stack.log_dir}/")
    print(f"  {'context':<{width}}  {context}")
    conversation = "demo-1" if served else "CONVERSATION"
    if served:
        print(
            f"\nTry:\n  curl -s {stack.gateway_url}/v1/chat/completions -H 'content-type: application/json' \\\n"
            f"    -d '{{\"model\": \"{served}\", \"conversation_id\": \"{conversation}\", "
            f"\"messages\": [{{\"role\": \"user\", \"content\": \"hello\"}}]}}' -i"
        )
    print("\nInspect it (from this folder):")
    for line in inspection_commands(stack, context, conversation):
        print(f"  {line}")
    print(f"BOOMERANG_READY up {stack.gateway_url.removeprefix('http://')}", flush=True)


def inspection_commands(stack: Stack, context: Path, conversation: str) -> list[str]:
    """`boomerang status` and `boomerang audit` as they will work in this shell.

    Bare when the context file is the one they read from the current folder; with
    BOOMERANG_CONTEXT when --data-dir put it elsewhere; with every address as a flag when
    an address variable is set here, since it would win over the context.
    """
    tenant = "" if stack.config.allow_anonymous else " --tenant TENANT"
    if any(env in os.environ for _, env, _ in SOURCES.values()):
        flags = f" --registry {stack.registry_address} --router {stack.router_address}"
        return [f"boomerang status{flags} --reaper {stack.reaper_address} --gateway {stack.gateway_url}",
                f"boomerang audit {conversation}{flags} --tenant {'TENANT' if tenant else 'anonymous'}"]
    named = os.environ.get(CONTEXT_ENV)
    found = named is None and context.resolve() == DEFAULT_PATH.resolve()
    prefix = "" if found else f"{CONTEXT_ENV}={context.resolve()} "
    return [f"{prefix}boomerang status", f"{prefix}boomerang audit {conversation}{tenant}"]
