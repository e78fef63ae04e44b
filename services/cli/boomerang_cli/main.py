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

# Each subcommand and the module that adds it, in the order `boomerang --help` lists them.
# A command module imports what its command runs (a server, a database driver) at its top, so
# running one command imports only its own module: `boomerang registry` never loads the
# gateway, the tools or the operator commands. Help and unknown commands load them all.
COMMANDS = {
    "registry": "boomerang_registry.cli",
    "router": "boomerang_router.cli",
    "gateway": "boomerang_gateway.cli",
    "tenants": "boomerang_gateway.cli",
    "up": "boomerang_tools.stack.cli",
    "demo": "boomerang_tools.demo.cli",
    "replay": "boomerang_tools.replay.cli",
    "bench": "boomerang_tools.bench.cli",
    "reaper": "boomerang_reaper.cli",
    "advise-ttl": "boomerang_reaper.cli",
    "migrate": "boomerang_cli.migrate",
    "credentials": "boomerang_cli.credentials",
    "status": "boomerang_cli.status",
    "audit": "boomerang_cli.audit",
    "sim": "boomerang_tools.sim.cli",
}
COMMAND_MODULES = list(dict.fromkeys(COMMANDS.values()))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser for `command` alone when it is a known command, else with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="boomerang",
        description="Boomerang: KV-cache reuse control plane for disaggregated vLLM serving.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    modules = [COMMANDS[command]] if command in COMMANDS else COMMAND_MODULES
    for name in modules:
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
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    logging.basicConfig(
        level=getattr(args, "log_level", None) or "INFO",
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    result = args.handler(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
