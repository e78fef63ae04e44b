"""One place that turns a command's failure into one line: what failed, and how to fix it.

`boomerang` (main.py) runs every subcommand through `describe`: a failure of a known class
(a refused credential, a database or service that cannot be reached, a malformed URL, a
bad value) becomes one line on stderr and exit status 1, with no traceback. What is not
recognised is a bug, and keeps its traceback, which is what a bug report needs.

What failed is named from the most specific knowledge at hand: a command that knows whom it
was talking to wraps the failure in `TargetFailure` (`boomerang status` knows it was the
registry at an address taken from the context file); otherwise the traceback says whether
the database driver or an HTTP client was at work.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import os
import socket
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

# Modules whose frames in a traceback mean "the database was being talked to".
_DATABASE_MODULES = ("asyncpg", "sqlalchemy", "alembic", "boomerang_server.db")
_UNREACHABLE_ERRNOS = {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ECONNRESET,
                       errno.ETIMEDOUT, errno.EADDRNOTAVAIL}
TOKEN_FIX = ("set BOOMERANG_AUTH_TOKEN (or BOOMERANG_AUTH_TOKEN_FILE) to a live token, "
             "issued with `boomerang credentials create service:NAME`")

# Commands that talk to one service: its name, the argument holding its address, its flag (for the fix).
_SERVICE_OF_COMMAND = {"advise-ttl": ("reaper", "reaper", "--reaper"), "replay": ("endpoint", "url", "--url")}

URL_FORM = "it must look like postgresql://USER:PASSWORD@HOST:5432/DATABASE"

T = TypeVar("T")


@dataclass(frozen=True)
class Target:
    """Whom a command was talking to, and which setting names it (for the fix)."""

    name: str  # "registry", "database"
    address: str  # printable: a database URL without its password
    setting: str  # "--registry (BOOMERANG_REGISTRY_ADDRESS)"

    def __str__(self) -> str:
        return f"the {self.name} at {self.address}" if self.address else f"the {self.name}"


class TargetFailure(Exception):
    """A failure while talking to `target`; the original failure is its `__cause__`."""

    def __init__(self, target: Target):
        super().__init__(str(target))
        self.target = target


def run_against(target: Target, coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)`, naming `target` in any failure."""
    try:
        return asyncio.run(coro)
    except Exception as exc:
        raise TargetFailure(target) from exc


def safe_url(url: str) -> str:
    """A database URL as it may be printed: no password, no query (it may hold one)."""
    try:
        parts = urlsplit(url)
        user = f"{parts.username}@" if parts.username else ""
        # host:port, or a libpq multi-host list (h1:5432,h2:5432) as it was given
        host = parts.netloc.rpartition("@")[2]
    except ValueError:
        return "(malformed URL)"
    if any(":" in h and not h.endswith("]") and not h.rpartition(":")[2].isdigit() for h in host.split(",")):
        return "(malformed URL)"
    if not parts.scheme or not host:
        return "(malformed URL)"
    return f"{parts.scheme}://{user}{host}{parts.path}"


def database_target(url: str | None) -> Target:
    """The database a command was given (flag, else environment)."""
    url = url or os.environ.get("BOOMERANG_DATABASE_URL", "")
    return Target("database", safe_url(url) if url else "", "--database-url (BOOMERANG_DATABASE_URL)")


def describe(exc: BaseException, args: argparse.Namespace | None = None) -> str | None:
    """One line saying what failed and how to fix it, or None for a failure of no known class."""
    chain = list(_chain(exc))
    target = next((e.target for e in chain if isinstance(e, TargetFailure)), None) or _infer_target(chain, args)
    for kind in _KINDS:
        for e in chain:
            line = kind(e, target)
            if line:
                return line
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception, its causes and the exceptions it was raised while handling, once each."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, getattr(e, "orig", None)]


def _modules(e: BaseException) -> Iterator[str]:
    tb = e.__traceback__
    while tb is not None:
        yield str(tb.tb_frame.f_globals.get("__name__", ""))
        tb = tb.tb_next


def _infer_target(chain: list[BaseException], args: argparse.Namespace | None) -> Target | None:
    for e in chain:
        if type(e).__module__.startswith(("asyncpg", "sqlalchemy")) or any(
            m.startswith(_DATABASE_MODULES) for m in _modules(e)
        ):
            return database_target(getattr(args, "database_url", None))
    name, dest, flag = _SERVICE_OF_COMMAND.get(getattr(args, "command", None) or "", ("", "", ""))
    address = getattr(args, dest, None) if dest else None
    if address:
        return Target(name, str(address), flag)
    for e in chain:
        request = _httpx_request(e)
        if request is not None:
            return Target("HTTP endpoint", str(request.url), "the URL given")
    return None


def _httpx_request(e: BaseException) -> Any:
    if not type(e).__module__.startswith("httpx"):
        return None
    try:
        return e.request  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):  # httpx raises RuntimeError when no request is attached
        return None


def _who(target: Target | None, fallback: str = "the server") -> str:
    return str(target) if target else fallback


def _fix_setting(target: Target | None, what: str) -> str:
    return f"check {what} in {target.setting}" if target else f"check {what}"


# -- failure classes, most specific first ------------------------------------------------------


def _pg_refused(e: BaseException, target: Target | None) -> str | None:
    # deferred: only on failure (every command imports this module, not every one a database driver)
    import asyncpg

    if isinstance(e, (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError)):
        return (f"{_who(target, 'the database')} refused the credentials ({_first_line(e)}); "
                f"{_fix_setting(target, 'the user name and password')}")
    if isinstance(e, asyncpg.InvalidCatalogNameError):
        return (f"{_who(target, 'the database server')}: {_first_line(e)}; create it (`createdb NAME`) "
                f"or {_fix_setting(target, 'the database name')}")
    if isinstance(e, asyncpg.UndefinedTableError):
        return (f"{_who(target, 'the database')} has no Boomerang tables ({_first_line(e)}); "
                "apply them with `boomerang migrate --database-url URL`")
    return None


def _rpc(e: BaseException, target: Target | None) -> str | None:
    # deferred: only on failure (every command imports this module, not every one gRPC)
    import grpc
    from boomerang.clients.base import BoomerangClientError

    if isinstance(e, BoomerangClientError):
        code, reason, message, method = e.code, e.reason, e.error.message, e.method
    elif isinstance(e, grpc.RpcError) and hasattr(e, "code"):
        code, reason, message, method = e.code().name, "", str(e.details() or ""), "the call"
    else:
        return None
    who = _who(target, "the service")
    why = f" ({reason})" if reason else ""
    message = _first_line(message)
    if code == "UNAVAILABLE":
        return f"cannot reach {who}: {message}; is it running? {_fix_setting(target, 'the address')}"
    if code == "UNAUTHENTICATED":
        return f"{who} refused the credentials{why}: {message}; {TOKEN_FIX}"
    if code == "PERMISSION_DENIED":
        return f"{who} denied {method}{why}: {message}; use a token of a principal allowed to call it ({TOKEN_FIX})"
    if code == "DEADLINE_EXCEEDED":
        return f"{who} did not answer {method} in time; is it overloaded or the wrong address? raise --timeout"
    if code == "UNIMPLEMENTED":
        return f"{who} does not serve {method}; {_fix_setting(target, 'that the address is the right service')}"
    if code == "INVALID_ARGUMENT":
        return f"{who} rejected {method}: {message}; fix that value"
    return f"{who}: {method} failed: {code}{why}: {message}"


def _unreachable(e: BaseException, target: Target | None) -> str | None:
    if type(e).__module__.startswith("httpx") and type(e).__name__ in ("ConnectError", "ConnectTimeout"):
        return f"cannot reach {_who(target)}: {_first_line(e)}; is it running? {_fix_setting(target, 'the address')}"
    unreachable = isinstance(e, (ConnectionError, socket.gaierror, TimeoutError)) or (
        isinstance(e, OSError) and e.errno in _UNREACHABLE_ERRNOS)
    if not unreachable:
        return None
    detail = _first_line(e) or type(e).__name__
    return f"cannot reach {_who(target)}: {detail}; is it running? {_fix_setting(target, 'the host and port')}"


def _pg_other(e: BaseException, target: Target | None) -> str | None:
    # deferred: only on failure, as above
    import asyncpg

    if isinstance(e, asyncpg.PostgresError):
        return f"{_who(target, 'the database')}: {_first_line(e)}"
    return None


def _bad_url(e: BaseException, target: Target | None) -> str | None:
    if type(e).__module__.startswith("sqlalchemy") and type(e).__name__ == "ArgumentError":
        return f"malformed database URL ({_first_line(e)}); {_fix_setting(target, 'the URL')}: {URL_FORM}"
    return None


def _settings(e: BaseException, target: Target | None) -> str | None:
    """Each bad setting with its flag and variable, on one line (every command reads its
    settings through load_settings, which raises InvalidSettings)."""
    # deferred: only on failure (pydantic is not every command's to import)
    from boomerang_server.config import InvalidSettings

    return str(e) if isinstance(e, InvalidSettings) else None


def _bad_value(e: BaseException, target: Target | None) -> str | None:
    if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)) and e.filename:
        return f"{e.filename}: {e.strerror}; check the path and its permissions"
    if not isinstance(e, ValueError) or isinstance(e, UnicodeError):
        return None
    message = _first_line(e)
    if target is not None and target.name == "database":
        form = "" if "postgresql://" in message else f"; {URL_FORM}"  # the message may show the form already
        return f"the database URL {target.setting}: {message}{form}"
    return f"bad value: {message}" if message else None


def _first_line(e: BaseException | str) -> str:
    return next((line.strip() for line in str(e).splitlines() if line.strip()), "")


_KINDS: list[Callable[[BaseException, Target | None], str | None]] = [
    _pg_refused, _rpc, _unreachable, _pg_other, _bad_url, _settings, _bad_value,
]
