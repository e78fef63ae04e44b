"""Every `boomerang` subcommand that reaches a database or a service, given bad input, answers with
one line that says what failed and how to fix it, and exits non-zero (issue 26).

The kinds of bad input: a malformed database URL, an unreachable database or service (a
closed port), a refused credential (a role the real Postgres does not have, a database it
does not have; a wrong or missing token at a registry that requires one) and a bad flag.
The local Postgres trusts every password, so a wrong *password* is checked against `up`'s
embedded cluster, which does not (test_up_context.py).

Each case is a real `boomerang` process; they run a few at a time, once per module.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from boomerang_cli.main import commands

from tests.conftest import ADMIN_URL
from tests.support.procs import BOOMERANG, ServiceProcess

pytestmark = pytest.mark.e2e

# A fix is an instruction: one of these words says what to do.
FIX = re.compile(r"\b(check|create|set|give|is it running|apply|raise|use|fix|it must look like|e\.g\.)")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CLOSED = _closed_port()
SERVER = ADMIN_URL.replace("postgresql+asyncpg://", "postgresql://").rsplit("/", 1)[0]  # scheme://user@host:port
HOST_PORT = SERVER.split("@", 1)[-1].split("://")[-1]
URLS = {
    "not a URL": ("not-a-url", "PostgreSQL URL"),
    "port not a number": ("postgresql://root@127.0.0.1:notaport/boomerang", "database URL"),
    "closed port": (f"postgresql://root@127.0.0.1:{CLOSED}/boomerang", "cannot reach the database"),
    "unknown role": (f"postgresql://no_such_role_{uuid.uuid4().hex[:6]}@{HOST_PORT}/postgres", "refused the credentials"),
    "unknown database": (f"{SERVER}/no_such_db_{uuid.uuid4().hex[:6]}", "does not exist"),
}
# Every subcommand that reads a database URL, with {url} where it goes.
DATABASE_COMMANDS = {
    "migrate": ["migrate", "--database-url", "{url}"],
    "credentials": ["credentials", "--database-url", "{url}", "list"],
    "tenants": ["tenants", "--database-url", "{url}", "list"],
    "registry": ["registry", "--listen", "127.0.0.1:0", "--database-url", "{url}"],
    "router": ["router", "--listen", "127.0.0.1:0", "--database-url", "{url}"],
    "reaper": ["reaper", "--listen", "127.0.0.1:0", "--database-url", "{url}"],
    "gateway": ["gateway", "--listen", "127.0.0.1:0", "--registry", f"127.0.0.1:{CLOSED}", "--database-url", "{url}"],
    "up": ["up", "--sim", "1x1", "--free-ports", "--database-url", "{url}"],
}
REPLAY_FILE = "conversations.jsonl"
# Every command meets these; a few meet every kind (the same code path serves the others).
EVERY_COMMAND_KINDS = {"not a URL", "closed port", "unknown role"}
EVERY_KIND_COMMANDS = {"migrate", "tenants", "registry", "up"}
# A gRPC service each command reads, unreachable.
SERVICE_COMMANDS = {
    "status": (["status", "--registry", f"127.0.0.1:{CLOSED}"], "cannot reach the registry"),
    "audit": (["audit", "conv-1", "--tenant", "t", "--registry", f"127.0.0.1:{CLOSED}"], "cannot reach the registry"),
    "advise-ttl": (["advise-ttl", "--reaper", f"127.0.0.1:{CLOSED}"], "cannot reach the reaper"),
}


@dataclass
class Case:
    """One command line, and what its one line must name."""

    args: list[str]
    names: str  # a phrase the line must contain (what failed)
    env: dict[str, str] = field(default_factory=dict)
    flag_error: bool = False  # argparse's usage + "error:" line, exit status 2


def _cases(secured: str) -> dict[str, Case]:
    cases: dict[str, Case] = {}
    for command, template in DATABASE_COMMANDS.items():
        for kind, (url, names) in URLS.items():
            if kind in EVERY_COMMAND_KINDS or command in EVERY_KIND_COMMANDS:
                cases[f"{command} / {kind}"] = Case([a.replace("{url}", url) for a in template], names)
    # demo runs its no-database mode (about a minute) before it reads the URL, bench starts its
    # progress display: one case each. bench's URL names a server to make a scratch database on.
    cases["demo / closed port"] = Case(["demo", "--quick", "--database-url", URLS["closed port"][0]], "cannot reach")
    cases["demo / not a URL"] = Case(["demo", "--quick", "--database-url", "not-a-url"], "PostgreSQL URL")
    # The flag after the action too, as `credentials` takes it.
    for kind in ("not a URL", "closed port"):
        url, names = URLS[kind]
        cases[f"tenants list / {kind}"] = Case(["tenants", "list", "--database-url", url], names)
    # replay's endpoint is HTTP; its file is written into the folder the cases run in.
    cases["replay / closed port"] = Case(["replay", REPLAY_FILE, "--url", f"http://127.0.0.1:{CLOSED}"],
                                         "cannot reach the endpoint")
    cases["replay / not a URL"] = Case(["replay", REPLAY_FILE, "--url", "not-a-url"], "--url")
    cases["bench / unknown role"] = Case(["bench", "--quick", "--database-url", URLS["unknown role"][0]], "refused")
    for command, (args, names) in SERVICE_COMMANDS.items():
        cases[f"service {command}"] = Case(args, names)
    for command in ("status", "audit"):
        extra = ["conv-1", "--tenant", "t"] if command == "audit" else []
        for kind, token in (("wrong token", "bmr_forged_token"), ("no token", "")):
            cases[f"{command} / {kind}"] = Case([command, *extra, "--registry", secured, "--router", ""],
                                                "refused the credentials", env={"BOOMERANG_AUTH_TOKEN": token})
    for command in sorted(commands()):
        # argparse names the unknown flag, or first a required argument the command lacks.
        cases[f"{command} / unknown flag"] = Case([command, "--no-such-flag"],
                                                  "--no-such-flag|the following arguments are required", flag_error=True)
    cases["status / bad number"] = Case(["status", "--timeout", "soon"], "--timeout", flag_error=True)
    cases["audit / no conversation"] = Case(["audit"], "CONVERSATION", flag_error=True)
    # audit, status and advise-ttl read the services only: no database flag.
    for command in (["audit", "conv-1"], ["status"], ["advise-ttl"]):
        cases[f"{command[0]} / database URL"] = Case([*command, "--database-url", URLS["closed port"][0]],
                                                     "--database-url", flag_error=True)
    cases["up / bad engine spec"] = Case(["up", "--sim", "three"], "--sim wants PxD", flag_error=False)
    return cases


@dataclass
class Result:
    code: int
    stderr: str
    stdout: str = ""


def _run(case: Case, cwd: Path) -> Result:
    env = {k: v for k, v in os.environ.items()
           if k not in ("BOOMERANG_DATABASE_URL", "BOOMERANG_REGISTRY_ADDRESS", "BOOMERANG_ROUTER_ADDRESS")}
    env.update({"BOOMERANG_CONTEXT": "", **case.env})
    out = subprocess.run([BOOMERANG, *case.args], capture_output=True, text=True, timeout=60, cwd=cwd, env=env)
    return Result(out.returncode, out.stderr, out.stdout)


@pytest.fixture(scope="module")
def secured(database_url: str) -> Iterator[str]:
    """A registry that requires a token."""
    proc = ServiceProcess(["registry", "--listen", "127.0.0.1:0"],
                          {"BOOMERANG_DATABASE_URL": database_url, "BOOMERANG_REQUIRE_AUTH": "true"}).start()
    yield proc.address
    proc.kill()


@pytest.fixture(scope="module")
def results(secured: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Case, Result]]:
    """Every case's outcome, four processes at a time (each is a cold Python start)."""
    cwd = tmp_path_factory.mktemp("bad-input")
    (cwd / REPLAY_FILE).write_text('{"conversation_id": "c1", "model": "m", "messages": [{"role": "user", "content": "hi"}]}\n')
    cases = _cases(secured)
    with ThreadPoolExecutor(4) as pool:
        outcomes = dict(zip(cases, pool.map(lambda c: _run(c, cwd), cases.values()), strict=True))
    return {name: (cases[name], outcomes[name]) for name in cases}


def _case_ids() -> list[str]:
    return list(_cases("127.0.0.1:1"))


# The first case waits for all of them (about seventy cold starts) on a machine that may be busy.
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", _case_ids())
def test_one_line_that_says_what_failed_and_how_to_fix_it(name: str, results: dict[str, tuple[Case, Result]]) -> None:
    case, result = results[name]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.code != 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert lines, "nothing on stderr"
    last = lines[-1]
    if case.flag_error:
        # argparse: its usage, then one line naming the flag; exit status 2.
        assert result.code == 2, result.stderr
        assert re.match(r"^boomerang( \S+)?: error: ", last), result.stderr
        assert re.search(case.names, last), result.stderr
        return
    command = case.args[0]
    # One line: the message, alone (blank lines aside; `bench` opens its progress display first).
    assert len(lines) == 1, result.stderr
    assert last.startswith(f"boomerang {command}: "), last
    assert case.names in last, last
    assert FIX.search(last.split(": ", 1)[1]), f"no fix in: {last}"


def test_demo_and_replay_check_their_target_before_they_run(results: dict[str, tuple[Case, Result]]) -> None:
    # Nothing on stdout: no banner, no progress, no table of nothing (the demo used to spend a
    # minute on its database-free deployments first; replay printed a table of failed turns).
    for name in ("demo / closed port", "demo / not a URL", "replay / closed port", "replay / not a URL"):
        assert results[name][1].stdout == "", f"{name}: {results[name][1].stdout[:500]}"


def test_every_subcommand_is_swept_for_bad_flags() -> None:
    swept = {n.split(" / ")[0] for n in _case_ids() if n.endswith("unknown flag")}
    assert swept == set(commands())


def test_verbose_keeps_the_one_line_and_adds_the_traceback(tmp_path: Path) -> None:
    url = URLS["closed port"][0]
    result = _run(Case(["migrate", "-v", "--database-url", url], ""), tmp_path)
    assert result.code == 1 and "Traceback" in result.stderr
    assert result.stderr.rstrip().splitlines()[-1].startswith("boomerang migrate: cannot reach the database at ")


def test_a_password_never_appears_in_the_line(tmp_path: Path) -> None:
    result = _run(Case(["migrate", "--database-url", f"postgresql://root:s3cret-pw@127.0.0.1:{CLOSED}/x"], ""), tmp_path)
    assert result.code == 1 and "s3cret-pw" not in result.stderr, result.stderr
    assert "postgresql://root@127.0.0.1:" in result.stderr
