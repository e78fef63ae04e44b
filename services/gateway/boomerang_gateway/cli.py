"""`boomerang gateway` (the OpenAI-compatible front door) and `boomerang tenants` (API keys)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from boomerang.auth import is_loopback
from boomerang_server.config import (
    CommonSettings,
    add_settings_flags,
    load_settings,
    require_database,
    run_async,
    settings_from_args,
)
from boomerang_server.db import make_engine, upgrade

from boomerang_gateway.server import run
from boomerang_gateway.settings import GatewaySettings
from boomerang_gateway.tenants import TenantExists, TenantStore


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `gateway` (its flags are GatewaySettings' fields) and `tenants` subcommands."""
    parser = subparsers.add_parser(
        "gateway",
        help="run the OpenAI-compatible HTTP gateway (replaces vLLM's multi-turn proxy)",
        description="Serve /v1/chat/completions and /v1/completions in front of prefill/decode engines, "
        "reusing each conversation's retained KV cache through the router.",
    )
    add_settings_flags(parser, GatewaySettings)
    parser.set_defaults(handler=_run_gateway)

    tenants = subparsers.add_parser("tenants", help="manage the gateway's tenants and their API keys")
    tenants.add_argument("--database-url", help="PostgreSQL URL (BOOMERANG_DATABASE_URL)")
    actions = tenants.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="create a tenant and print its API key (shown once)")
    create.add_argument("name", help="tenant name: letters, digits, '.', '_', '-' (at most 128)")
    create.set_defaults(handler=_run_tenants)
    listing = actions.add_parser("list", help="list tenants (never their keys)")
    listing.set_defaults(handler=_run_tenants)
    for sub in (create, listing):  # after the action too (`tenants list --database-url URL`), as credentials
        sub.add_argument("--database-url", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def _run_gateway(args: argparse.Namespace) -> int:
    settings = settings_from_args(GatewaySettings, args)
    check(settings)
    run_async(run(settings))
    return 0


def check(settings: GatewaySettings) -> None:
    """Exit with what to change when the gateway cannot serve as configured."""
    if not settings.database_url and not settings.allow_anonymous:
        raise SystemExit(
            "boomerang gateway: no database configured for API keys: set BOOMERANG_DATABASE_URL "
            "(or --database-url), or serve without keys with --allow-anonymous"
        )
    check_anonymous_listener(settings)
    if bool(settings.prefill_engines) != bool(settings.decode_engines):
        raise SystemExit("boomerang gateway: give both --prefill and --decode engines, or neither (registry)")
    if not settings.prefill_engines and not settings.registry_address:
        raise SystemExit("boomerang gateway: no engines: give --prefill and --decode URLs, or --registry")


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
    url = require_database(load_settings(CommonSettings, database_url=args.database_url), "tenants")
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
