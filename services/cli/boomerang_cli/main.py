"""`boomerang`: one command line for every service and operator tool.

Each subcommand lives in its own module exposing `register(subparsers)`; this file only
lists them. Service commands take their settings from `BOOMERANG_*` variables, and flags
override them.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# Modules that add subcommands, in the order `boomerang --help` lists them.
COMMAND_MODULES = [
    "boomerang_registry.cli",
    "boomerang_router.cli",
    "boomerang_gateway.cli",
    "boomerang_tools.stack.cli",
    "boomerang_tools.demo.cli",
    "boomerang_tools.replay.cli",
    "boomerang_tools.bench.cli",
    "boomerang_reaper.cli",
    "boomerang_cli.migrate",
    "boomerang_cli.credentials",
    "boomerang_cli.status",
    "boomerang_cli.audit",
    "boomerang_tools.sim.cli",
]


def build_parser() -> argparse.ArgumentParser:
    """The full parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="boomerang",
        description="Boomerang: KV-cache reuse control plane for disaggregated vLLM serving.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def subcommand_names() -> list[str]:
    """The names of every subcommand (used by tests of docker-compose.yml)."""
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return sorted(action.choices)
    return []


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run the chosen subcommand."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(args, "log_level", None) or "INFO",
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    result = args.handler(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
