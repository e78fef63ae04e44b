"""`boomerang registry`: the block-registry service."""

from __future__ import annotations

import argparse

from boomerang_server.config.flags import (
    add_settings_flags,
    require_database,
    run_async,
    settings_from_args,
)

from boomerang_registry.server import run
from boomerang_registry.settings import RegistrySettings


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `registry` subcommand; its flags are RegistrySettings' fields."""
    parser = subparsers.add_parser("registry", help="run the block-registry gRPC service")
    add_settings_flags(parser, RegistrySettings)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    settings = settings_from_args(RegistrySettings, args)
    require_database(settings, "registry")

    run_async(run(settings))
    return 0
