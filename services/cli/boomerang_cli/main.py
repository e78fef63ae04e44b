"""`boomerang`: one command line for every service and operator tool.

Each subcommand lives in its own module exposing `register(subparsers)`; this file only
lists them. Service commands take their settings from `BOOMERANG_*` variables, and flags
override them.

Every command runs through `run`: a failure of a known class (failures.py) ends in one line
on stderr and exit status 1, and libraries' log records below WARNING (httpx's request
lines, alembic's steps) are dropped unless `-v` asks for them: a command's output is for
the person reading it. Boomerang's own records keep their level (`--log-level` for services).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback

from boomerang_cli.failures import describe

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
    _add_verbose(parser, top=True)
    return parser


def _add_verbose(parser: argparse.ArgumentParser, top: bool = False) -> None:
    """`-v` on the top parser and on every subcommand's, so it works before or after the command."""
    # Below the top, SUPPRESS: a subcommand's parser would otherwise reset a `-v` given before it.
    parser.add_argument("-v", "--verbose", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="show libraries' log records and the traceback of a failure")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in {id(p): p for p in action.choices.values()}.values():
                _add_verbose(sub)


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
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    try:
        configure_logging(getattr(args, "log_level", None) or "INFO", args.verbose)
        result = args.handler(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        line = describe(exc, args)
        if line is None:
            raise  # not a known failure: a bug, whose traceback is what a report needs
        if args.verbose:
            traceback.print_exc()
        print(f"boomerang {args.command}: {line}", file=sys.stderr)
        return 1
    return int(result or 0)


def configure_logging(level: str, verbose: bool) -> None:
    """Log to stderr at `level`; other libraries' records below WARNING only when `verbose`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    if not verbose:
        handler.addFilter(_quiet_libraries)
    logging.basicConfig(level=level, handlers=[handler])


def _quiet_libraries(record: logging.LogRecord) -> bool:
    """Keep Boomerang's records (packages `boomerang*`, `__main__`) and any library's warnings."""
    return record.levelno >= logging.WARNING or record.name.startswith(("boomerang", "__main__"))


if __name__ == "__main__":
    sys.exit(main())
