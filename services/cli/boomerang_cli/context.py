"""The context: where the stack `boomerang up` started listens, for the CLI run from the same folder.

`up` writes `<data dir>/context.json` (default `./.boomerang/context.json`, mode 0600) once
every component answers, and removes it when it stops. `boomerang status` and `boomerang
audit` read `./.boomerang/context.json` of the current folder (or the file
`BOOMERANG_CONTEXT` names; set it empty to use none) when no flag or environment variable
gives an address, as kubectl and docker read their current context. Only the current
folder is looked at, not its parents: a command never silently reaches a stack started
somewhere else.

A context whose `up` is no longer running (killed with SIGKILL, so it could not remove the
file) is stale: it is ignored, with one line on stderr saying so.

Each address `status` and `audit` read from comes from, in order: its flag, its environment
variable, the context, the built-in default. Whatever chose it is named when it cannot be
reached, so the fix names the right knob.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from boomerang_cli.failures import Target

CONTEXT_ENV = "BOOMERANG_CONTEXT"
FILE_NAME = "context.json"
DEFAULT_PATH = Path(".boomerang") / FILE_NAME  # up's default --data-dir, relative to the current folder


@dataclass(frozen=True)
class StackContext:
    """What `up` started: gRPC HOST:PORTs, the gateway's base URL, its anonymous tenant, its database."""

    registry: str
    router: str
    reaper: str
    gateway: str = ""
    tenant: str = ""  # the tenant requests without an API key run as ("anonymous"), when allowed
    database_url: str = ""  # only the embedded cluster's (its password file sits in the same folder)
    pid: int = 0
    process_start: str = ""  # the kernel's start time of `pid`, telling a reused pid apart


def write_context(data_dir: Path, context: StackContext) -> Path:
    """Write `context` as `data_dir`/context.json (atomically, mode 0600), stamped with this process."""
    path = data_dir / FILE_NAME
    stamped = replace(context, pid=os.getpid(), process_start=_process_start(os.getpid()))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{FILE_NAME}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(asdict(stamped), out, indent=2)
        out.write("\n")
    os.replace(tmp, path)
    return path


def remove_context(path: Path) -> None:
    """Remove the context file if this process wrote it (a second `up` on the folder may have since)."""
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


def context_path() -> Path | None:
    """The context file to read: `BOOMERANG_CONTEXT` when set (empty: none), else ./.boomerang/context.json."""
    named = os.environ.get(CONTEXT_ENV)
    if named is None:
        return DEFAULT_PATH
    return Path(named) if named else None


def load_context(path: Path | None = None) -> StackContext | None:
    """The live context, or None when there is none; a malformed or stale one is ignored, saying so."""
    path = path or context_path()
    if path is None or not path.exists():
        return None
    try:
        raw = json.loads(path.read_text())
        context = StackContext(**{k: v for k, v in raw.items() if k in StackContext.__dataclass_fields__})
    except (OSError, ValueError, TypeError) as exc:
        _note(f"ignoring {path}: not a context `boomerang up` wrote ({exc})")
        return None
    if not _alive(context.pid, context.process_start):
        _note(f"ignoring {path}: the `boomerang up` that wrote it (pid {context.pid}) is no longer running")
        return None
    return context


def _note(line: str) -> None:
    print(f"boomerang: {line}", file=sys.stderr)


def _process_start(pid: int) -> str:
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot); "" where there is no /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _alive(pid: int, process_start: str) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, run by another user
    return not process_start or _process_start(pid) in ("", process_start)


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
