"""`boomerang router`: the routing service."""

from __future__ import annotations

import argparse

from boomerang_server.config.flags import (
    add_settings_flags,
    require_database,
    run_async,
    settings_from_args,
)

from boomerang_router.server import run
from boomerang_router.settings import RouterSettings


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `router` subcommand; its flags are RouterSettings' fields."""
    parser = subparsers.add_parser("router", help="run the router gRPC service (turn plans, engine choice)")
    add_settings_flags(parser, RouterSettings)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    settings = settings_from_args(RouterSettings, args)
    require_database(settings, "router")

    run_async(run(settings))
    return 0
