"""`boomerang registry`: the block-registry service."""

from __future__ import annotations

import argparse

from boomerang.config.flags import add_common_flags, common_overrides, require_database, run_async
from boomerang.config.settings import load_settings

from boomerang_registry.server import run
from boomerang_registry.settings import RegistrySettings


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `registry` subcommand."""
    parser = subparsers.add_parser("registry", help="run the block-registry gRPC service")
    add_common_flags(parser)
    parser.add_argument("--listen", help="gRPC HOST:PORT (BOOMERANG_LISTEN, default 127.0.0.1:50051)")
    parser.add_argument("--ttl-margin-seconds", type=float, help="end leases this long before D's TTL (default 10)")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    settings = load_settings(
        RegistrySettings,
        **common_overrides(args),
        listen=args.listen,
        ttl_margin_seconds=args.ttl_margin_seconds,
    )
    require_database(settings, "registry")

    run_async(run(settings))
    return 0
