"""Where `boomerang status` and `boomerang audit` read from, and how each address was chosen.

Each address comes from, in order: its flag, its environment variable, the context of the
`boomerang up` started from this folder (context.py), the built-in default. Whatever chose
it is named when it cannot be reached, so the fix names the right knob.
"""

from __future__ import annotations

import argparse
import os

from boomerang_cli.context import context_path, load_context
from boomerang_cli.failures import Target

DEFAULT_REGISTRY = "127.0.0.1:50051"
DEFAULT_ROUTER = "127.0.0.1:50052"
DEFAULT_REAPER = "127.0.0.1:50053"

# Per source: its flag, its environment variable, its default.
SOURCES = {
    "registry": ("--registry", "BOOMERANG_REGISTRY_ADDRESS", DEFAULT_REGISTRY),
    "router": ("--router", "BOOMERANG_ROUTER_ADDRESS", DEFAULT_ROUTER),
    "reaper": ("--reaper", "BOOMERANG_REAPER_ADDRESS", DEFAULT_REAPER),
    "gateway": ("--gateway", "BOOMERANG_GATEWAY_URL", ""),
}


def add_source_flags(parser: argparse.ArgumentParser, router: bool = True, reaper: bool = True) -> None:
    """--registry/--router/--reaper: the services' APIs to read."""
    where = "default: $%s, else the `boomerang up` context in ./.boomerang, else %s"
    parser.add_argument("--registry", help="registry HOST:PORT (" + where % SOURCES["registry"][1:] + ")")
    if router:
        parser.add_argument("--router", help="router HOST:PORT; '' to skip (" + where % SOURCES["router"][1:] + ")")
    if reaper:
        parser.add_argument("--reaper", help="reaper HOST:PORT; '' to skip (" + where % SOURCES["reaper"][1:] + ")")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per call (default 5)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")


def resolve_sources(args: argparse.Namespace, *names: str) -> dict[str, str]:
    """Fill in `args.<name>` for each source not given by flag; return what chose each one.

    The context is read only when some address is left to it; `args.tenant`, when the
    command has one, defaults to the context's tenant (the gateway's anonymous one).
    """
    origin: dict[str, str] = {}
    context = None
    if any(getattr(args, n, None) is None and SOURCES[n][1] not in os.environ for n in names) or (
        hasattr(args, "tenant") and not args.tenant
    ):
        context = load_context()
    for name in names:
        flag, env, default = SOURCES[name]
        if getattr(args, name, None) is not None:
            origin[name] = flag
        elif env in os.environ:
            setattr(args, name, os.environ[env])
            origin[name] = f"${env}"
        elif context is not None and getattr(context, name):
            setattr(args, name, getattr(context, name))
            origin[name] = "context"
        else:
            setattr(args, name, default)
            origin[name] = "default"
    if hasattr(args, "tenant") and not args.tenant and context is not None and context.tenant:
        args.tenant = context.tenant
        origin["tenant"] = "context"
    return origin


def service_target(name: str, address: str, origin: dict[str, str]) -> Target:
    """The service `name` at `address`; its setting names what chose the address, for the fix."""
    flag, env, _ = SOURCES[name]
    setting = {
        "context": f"{context_path()} (written by `boomerang up` in this folder: is it still running?) or give {flag}",
        "default": f"{flag} or ${env} (neither was given, nor is there a `boomerang up` context in this folder)",
    }.get(origin.get(name, ""), origin.get(name, flag))
    return Target(name, address, setting)


__all__ = ["add_source_flags", "resolve_sources", "service_target"]
