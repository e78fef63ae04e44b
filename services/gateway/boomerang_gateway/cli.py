"""`boomerang gateway` (the OpenAI-compatible front door) and `boomerang tenants` (API keys)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from boomerang.auth import is_loopback
from boomerang.config.flags import add_common_flags, common_overrides, run_async
from boomerang.config.settings import CommonSettings, load_settings
from boomerang.db.engine import make_engine
from boomerang.db.migrate import upgrade

from boomerang_gateway.server import run
from boomerang_gateway.settings import GatewaySettings
from boomerang_gateway.tenants import TenantExists, TenantStore


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `gateway` and `tenants` subcommands."""
    parser = subparsers.add_parser(
        "gateway",
        help="run the OpenAI-compatible HTTP gateway (replaces vLLM's multi-turn proxy)",
        description="Serve /v1/chat/completions and /v1/completions in front of prefill/decode engines, "
        "reusing each conversation's retained KV cache through the router.",
    )
    add_common_flags(parser)
    parser.add_argument("--listen", help="HTTP HOST:PORT (BOOMERANG_LISTEN, default 127.0.0.1:8000; port 0: a free one)")
    parser.add_argument("--router", help="router HOST:PORT (BOOMERANG_ROUTER_ADDRESS, default 127.0.0.1:50052); '' for none")
    parser.add_argument("--registry", help="registry HOST:PORT for engine discovery (BOOMERANG_REGISTRY_ADDRESS)")
    parser.add_argument("--prefill", action="append", metavar="URL",
                        help="a static prefill engine's base URL (repeatable); without any, engines come from the registry")
    parser.add_argument("--decode", action="append", metavar="URL", help="a static decode engine's base URL (repeatable)")
    parser.add_argument("--allow-anonymous", action="store_true", default=None,
                        help="serve requests without a Boomerang API key as tenant 'anonymous'")
    parser.add_argument("--engine-hook", action="store_true", default=None,
                        help="the engines run the vLLM hook and plan themselves: no tokenize, PlanTurn or ReportTurn "
                        "here (BOOMERANG_ENGINE_HOOK)")
    parser.add_argument("--sticky-prefill", action="store_true", default=None,
                        help="pick the prefill engine by a hash of the conversation id wherever the router does "
                        "not pick it (BOOMERANG_STICKY_PREFILL)")
    parser.add_argument("--plan-timeout-seconds", type=float, help="PlanTurn deadline (default 0.25)")
    parser.add_argument("--tokenize-timeout-seconds", type=float, help="/tokenize deadline (default 1)")
    parser.add_argument("--max-body-bytes", type=int, help="largest request body (default 8 MiB)")
    parser.add_argument("--tenant-requests-per-second", type=float,
                        help="average requests/s per tenant, 429 past it (default 0: unlimited)")
    parser.add_argument("--tenant-burst", type=int, help="requests a tenant may send at once (default 50)")
    parser.set_defaults(handler=_run_gateway)

    tenants = subparsers.add_parser("tenants", help="manage the gateway's tenants and their API keys")
    tenants.add_argument("--database-url", help="PostgreSQL URL (BOOMERANG_DATABASE_URL)")
    actions = tenants.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="create a tenant and print its API key (shown once)")
    create.add_argument("name", help="tenant name: letters, digits, '.', '_', '-' (at most 128)")
    create.set_defaults(handler=_run_tenants)
    listing = actions.add_parser("list", help="list tenants (never their keys)")
    listing.set_defaults(handler=_run_tenants)


def _run_gateway(args: argparse.Namespace) -> int:
    settings = load_settings(
        GatewaySettings,
        **common_overrides(args),
        listen=args.listen,
        router_address=args.router,
        registry_address=args.registry,
        prefill_urls=args.prefill,
        decode_urls=args.decode,
        allow_anonymous=args.allow_anonymous,
        plan_timeout_seconds=args.plan_timeout_seconds,
        engine_hook=args.engine_hook,
        sticky_prefill=args.sticky_prefill,
        tokenize_timeout_seconds=args.tokenize_timeout_seconds,
        max_body_bytes=args.max_body_bytes,
        tenant_requests_per_second=args.tenant_requests_per_second,
        tenant_burst=args.tenant_burst,
    )
    if not settings.database_url and not settings.allow_anonymous:
        raise SystemExit(
            "boomerang gateway: no database configured for API keys: set BOOMERANG_DATABASE_URL "
            "(or --database-url), or serve without keys with --allow-anonymous"
        )
    check_anonymous_listener(settings)
    if bool(settings.prefill_urls) != bool(settings.decode_urls):
        raise SystemExit("boomerang gateway: give both --prefill and --decode engines, or neither (registry)")
    if not settings.prefill_urls and not settings.registry_address:
        raise SystemExit("boomerang gateway: no engines: give --prefill and --decode URLs, or --registry")

    run_async(run(settings))
    return 0


def check_anonymous_listener(settings: GatewaySettings) -> None:
    """Anonymous tenants beyond loopback only with the development setting (then loudly); else exit."""
    if not settings.allow_anonymous or is_loopback(settings.listen):
        return
    if not settings.insecure_allow_anonymous:
        raise SystemExit(
            f"boomerang gateway: --allow-anonymous would serve anyone who reaches {settings.listen} (beyond loopback) "
            "without an API key: create keys with `boomerang tenants create NAME` and drop --allow-anonymous, "
            "listen on 127.0.0.1, or (development only) set BOOMERANG_INSECURE_ALLOW_ANONYMOUS=true"
        )
    print(
        f"boomerang gateway: INSECURE: serving requests without an API key on {settings.listen}, beyond loopback "
        "(BOOMERANG_INSECURE_ALLOW_ANONYMOUS=true). Development only.",
        file=sys.stderr,
        flush=True,
    )


def _run_tenants(args: argparse.Namespace) -> int:
    settings = load_settings(CommonSettings, database_url=args.database_url)
    try:
        url = settings.require_database()
    except ValueError as exc:
        raise SystemExit(f"boomerang tenants: {exc}") from None
    return int(asyncio.run(_tenants(url, args)))


async def _tenants(url: str, args: argparse.Namespace) -> int:
    await asyncio.to_thread(upgrade, url)
    engine = make_engine(url, 1, "boomerang-tenants")
    store = TenantStore(engine)
    try:
        if args.action == "create":
            try:
                key = await store.create(args.name)
            except (ValueError, TenantExists) as exc:
                print(f"boomerang tenants create: {exc}", file=sys.stderr)
                return 1
            print(f"created tenant {args.name!r}; its API key (shown only now, store it safely):", file=sys.stderr)
            print(key)
            return 0
        rows = await store.list()
        if not rows:
            print("no tenants", file=sys.stderr)
        for row in rows:
            state = "disabled" if row.disabled else "active"
            print(f"{row.name}\tbmr_{row.key_id}_…\t{state}\t{row.created_at.isoformat(timespec='seconds')}")
        return 0
    finally:
        await engine.dispose()
