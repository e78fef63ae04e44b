"""`boomerang`: one command line for every service and operator tool.

Each subcommand lives in its own module exposing `register(subparsers)`, and the distribution
that ships it names it as an entry point of the group `boomerang.commands` (pyproject.toml;
the tools' in tools/pyproject.toml): this file finds them there and names no module, so the
import rules (tests/unit/test_imports.py) see every edge, and a command of a package that is
not installed (the tools, in the image) is simply absent. Service commands take their
settings from `BOOMERANG_*` variables, and flags override them.

Every command runs through `run`: a failure of a known class (failures.py) ends in one line
on stderr and exit status 1, and libraries' log records below WARNING (httpx's request
lines, alembic's steps) are dropped unless `-v` asks for them: a command's output is for
the person reading it. Boomerang's own records keep their level (`--log-level` for services).
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from importlib.metadata import EntryPoint, entry_points

from boomerang_cli.failures import describe

COMMAND_GROUP = "boomerang.commands"
# The tools' commands come with the boomerang-tools distribution (tools/), which the image and
# a plain `pip install .` leave out; asked for one, the CLI says how to get it
# (tests/unit/test_imports.py checks this list against tools/pyproject.toml).
TOOL_COMMANDS = ("up", "demo", "replay", "bench", "sim", "chaos")
TOOLS_HINT = ("the tools ({}) are not installed here: from a checkout, `pip install ./tools` "
              "(`make setup` does); the image holds the services only")


def commands() -> dict[str, EntryPoint]:
    """Each installed subcommand's entry point, by name in alphabetical order (`--help`'s)."""
    return {entry.name: entry for entry in sorted(entry_points(group=COMMAND_GROUP), key=lambda e: e.name)}


def build_parser(command: str | None = None,
                 installed: dict[str, EntryPoint] | None = None) -> argparse.ArgumentParser:
    """The parser for `command` alone when it is a known command, else with every subcommand.

    A command's module imports what its command runs (a server, a database driver) at its
    top, so running one command loads only its own module: `boomerang registry` never loads
    the gateway, the tools or the operator commands. Help and unknown commands load them all.
    `installed` saves finding the entry points again (a scan of every distribution's metadata).
    """
    installed = commands() if installed is None else installed
    missing = [c for c in TOOL_COMMANDS if c not in installed]
    parser = argparse.ArgumentParser(
        prog="boomerang",
        description="Boomerang: KV-cache reuse control plane for disaggregated vLLM serving.",
        epilog=TOOLS_HINT.format(", ".join(missing)) if missing else None,
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = [installed[command]] if command in installed else list(installed.values())
    # One module may add several commands (`gateway` and `tenants`): register it once.
    for entry in {e.value: e for e in chosen}.values():
        entry.load()(subparsers)
    subparsers._choices_actions.sort(key=lambda action: action.dest)  # `--help` lists them by name
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


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run the chosen subcommand."""
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    installed = commands()
    if command in TOOL_COMMANDS and command not in installed:
        print(f"boomerang {command}: " + TOOLS_HINT.format(", ".join(TOOL_COMMANDS)), file=sys.stderr)
        return 2
    args = build_parser(command, installed).parse_args(argv)
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
