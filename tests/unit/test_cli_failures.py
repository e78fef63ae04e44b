"""The CLI's one place for failures (boomerang_cli.failures), its quiet logging, and the `up` context
(boomerang_cli.context): each known failure class becomes one line naming what failed and a fix;
anything else is left to its traceback; a context is read only while its `up` runs."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import grpc
import httpx
import pytest
from boomerang.clients.base import BoomerangClientError
from boomerang.errors import BoomerangError, Code
from boomerang_cli import main as cli_main
from boomerang_cli.context import (
    StackContext,
    load_context,
    remove_context,
    resolve_sources,
    write_context,
)
from boomerang_cli.failures import Target, TargetFailure, database_target, describe, safe_url
from boomerang_server.config import InvalidSettings

REGISTRY = Target("registry", "127.0.0.1:9", "--registry")


def _raised(exc: BaseException, target: Target | None = None) -> BaseException:
    """`exc` as raised (with a traceback), wrapped in a TargetFailure when `target` is given."""
    try:
        try:
            raise exc
        except BaseException as inner:
            if target is None:
                raise
            raise TargetFailure(target) from inner
    except BaseException as outer:  # noqa: BLE001  (the test wants whatever was raised)
        return outer


def test_a_refused_role_names_the_database_without_its_password() -> None:
    url = "postgresql://alice:hunter2@db.example:5432/boomerang"
    line = describe(_raised(asyncpg.InvalidAuthorizationSpecificationError('role "alice" does not exist'),
                            database_target(url)))
    assert line is not None and "hunter2" not in line
    assert line.startswith("the database at postgresql://alice@db.example:5432/boomerang refused the credentials")
    assert "--database-url" in line


def test_an_unreachable_registry_says_to_check_the_address() -> None:
    err = BoomerangClientError("ListEngines", BoomerangError(Code.UNAVAILABLE, "", "connection refused"))
    line = describe(_raised(err, REGISTRY))
    assert line == "cannot reach the registry at 127.0.0.1:9: connection refused; is it running? check the address in --registry"


def test_a_bad_token_says_how_to_get_one() -> None:
    err = BoomerangClientError("ListEngines", BoomerangError(Code.UNAUTHENTICATED, "BAD_TOKEN", "bad token"))
    line = describe(_raised(err, REGISTRY))
    assert line is not None and "(BAD_TOKEN)" in line and "boomerang credentials create" in line


def test_a_connection_failure_found_while_handling_another_is_the_one_reported() -> None:
    # A clean-up that fails on the way out (bench's stop) must not hide why the command failed.
    try:
        try:
            raise ConnectionRefusedError(111, "Connect call failed")
        except ConnectionRefusedError:
            raise ValueError("no URL to clean up")
    except ValueError as exc:
        line = describe(exc)
    assert line is not None and line.startswith("cannot reach the server"), line


def test_a_bad_setting_is_the_configuration_not_the_database() -> None:
    # load_settings' one line, as it is: not reworded as a database URL although a database URL was at hand.
    bad = InvalidSettings(["BOOMERANG_DATABASE_URL (--database-url): must be a PostgreSQL URL"])
    line = describe(_raised(bad), argparse.Namespace(database_url="nope"))
    assert line == ("invalid configuration: BOOMERANG_DATABASE_URL (--database-url): must be a PostgreSQL URL; "
                    "fix that flag or variable")


def test_a_command_of_one_service_names_it_by_its_flag() -> None:
    err = BoomerangClientError("AdviseTTL", BoomerangError(Code.UNAVAILABLE, "", "connection refused"))
    line = describe(_raised(err), argparse.Namespace(command="advise-ttl", reaper="127.0.0.1:9"))
    assert line == "cannot reach the reaper at 127.0.0.1:9: connection refused; is it running? check the address in --reaper"
    refused = httpx.ConnectError("All connection attempts failed", request=httpx.Request("GET", "http://h:1/v1/models"))
    line = describe(_raised(refused), argparse.Namespace(command="replay", url="http://h:1"))
    assert line == "cannot reach the endpoint at http://h:1: All connection attempts failed; is it running? check the address in --url"


def test_a_bug_is_left_to_its_traceback() -> None:
    assert describe(_raised(KeyError("x"))) is None
    assert describe(_raised(TypeError("unsupported operand"), REGISTRY)) is None


def test_a_raw_grpc_error_is_described() -> None:
    class Unavailable(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAVAILABLE

        def details(self) -> str:
            return "failed to connect"

    assert describe(_raised(Unavailable(), REGISTRY)) == (
        "cannot reach the registry at 127.0.0.1:9: failed to connect; is it running? check the address in --registry")


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://u:p@h:5432/db?password=x", "postgresql://u@h:5432/db"),
    ("postgresql://h/db", "postgresql://h/db"),
    ("garbage", "(malformed URL)"),
    ("postgresql://u@h:port/db", "(malformed URL)"),
    ("postgresql://u:p@h1:5432,h2:5433/db?target_session_attrs=read-write", "postgresql://u@h1:5432,h2:5433/db"),
])
def test_safe_url(url: str, shown: str) -> None:
    assert safe_url(url) == shown


def test_libraries_are_quiet_unless_verbose(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    # Commands run in this process before (the demo's, the stack's) quiet httpx's own logger;
    # what is tested here is the CLI's filter, from a library logger at its default level.
    httpx_log = logging.getLogger("httpx")
    httpx_level = httpx_log.level
    httpx_log.setLevel(logging.NOTSET)
    try:
        for verbose in (False, True):
            root.handlers = []
            cli_main.configure_logging("INFO", verbose)
            logging.getLogger("httpx").info("HTTP Request: GET /metrics")
            logging.getLogger("httpx").warning("httpx warned")
            logging.getLogger("boomerang_registry.server").info("registry serving")
            err = capsys.readouterr().err
            assert ("HTTP Request" in err) is verbose
            assert "httpx warned" in err and "registry serving" in err
    finally:
        root.handlers, root.level = saved
        httpx_log.setLevel(httpx_level)


def test_verbose_works_before_and_after_the_command() -> None:
    parser = cli_main.build_parser("status")
    assert parser.parse_args(["-v", "status"]).verbose
    assert parser.parse_args(["status", "-v"]).verbose
    assert not parser.parse_args(["status"]).verbose
    creds = cli_main.build_parser("credentials")
    assert creds.parse_args(["credentials", "list", "-v"]).verbose


# -- the context --------------------------------------------------------------------------------


def _context() -> StackContext:
    return StackContext(registry="127.0.0.1:1001", router="127.0.0.1:1002", reaper="127.0.0.1:1003",
                        gateway="http://127.0.0.1:1004", tenant="anonymous")


def test_a_written_context_is_private_and_read_back(tmp_path: Path) -> None:
    path = write_context(tmp_path, _context())
    assert path == tmp_path / "context.json" and (path.stat().st_mode & 0o777) == 0o600
    got = load_context(path)
    assert got is not None and got.registry == "127.0.0.1:1001" and got.pid == os.getpid()
    remove_context(path)
    assert not path.exists()


def test_a_context_whose_up_is_gone_is_ignored_saying_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_context(tmp_path, _context())
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({**raw, "pid": int(dead.stdout)}))
    assert load_context(path) is None
    assert "is no longer running" in capsys.readouterr().err
    path.write_text("{not json")
    assert load_context(path) is None
    assert "not a context" in capsys.readouterr().err


def test_another_processes_context_is_not_removed(tmp_path: Path) -> None:
    path = write_context(tmp_path, _context())
    path.write_text(json.dumps({**json.loads(path.read_text()), "pid": 1}))
    remove_context(path)
    assert path.exists()


def test_flags_then_variables_then_the_context_then_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_context(tmp_path / ".boomerang", _context())
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BOOMERANG_CONTEXT", raising=False)
    for env in ("BOOMERANG_REGISTRY_ADDRESS", "BOOMERANG_ROUTER_ADDRESS", "BOOMERANG_REAPER_ADDRESS", "BOOMERANG_GATEWAY_URL"):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setenv("BOOMERANG_ROUTER_ADDRESS", "10.0.0.2:50052")
    args = argparse.Namespace(registry=None, router=None, reaper="", gateway=None, tenant=None)
    origin = resolve_sources(args, "registry", "router", "reaper", "gateway")
    assert (args.registry, args.router, args.reaper, args.gateway) == (
        "127.0.0.1:1001", "10.0.0.2:50052", "", "http://127.0.0.1:1004")
    assert origin == {"registry": "context", "router": "$BOOMERANG_ROUTER_ADDRESS", "reaper": "--reaper",
                      "gateway": "context", "tenant": "context"}
    assert args.tenant == "anonymous"
    monkeypatch.setenv("BOOMERANG_CONTEXT", "")  # none
    args = argparse.Namespace(registry=None, router=None, tenant=None)
    resolve_sources(args, "registry", "router")
    assert (args.registry, args.tenant) == ("127.0.0.1:50051", None)
